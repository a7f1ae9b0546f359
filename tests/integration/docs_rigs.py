"""Where a Python block of the docs runs on its own: the rigs a ``<!-- runs: RIG -->`` names.

Every rig is a fresh folder on PYTHONPATH holding the README's files (``myapp/jobs.py``),
a package ``myapp`` with a Django model ``Order`` on the README's ``orders`` table, and
``docs_settings`` (Django settings on DATABASE_URL); the database holds that table.

- ``alone``: the block as a script of its own (a test file, a snippet a reader copies);
- ``readme-queue``: the same after ``import brooq`` and ``from myapp.jobs import queue``
  (a fragment of the app the README builds);
- ``sqlalchemy``: alone, with ``SQLALCHEMY_URL`` (``postgresql+psycopg://``) set;
- ``django``: in a set-up Django (``django.setup()`` done), then ``EXPRESSION``;
- ``alembic-revision`` / ``django-migration``: the block is a migration file; the test
  migrates an empty database with it, up and down (:func:`alembic` / :func:`django_migrate`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.integration.docs_blocks import README_SCRIPT, SCRIPTS, Block, clean_env, rig_of

FILE_COMMENT = re.compile(r"^#\s*([\w./-]+\.py)\s*$")
ORDERS = "CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY, paid bool NOT NULL DEFAULT false)"
PREAMBLE = {"readme-queue": "import brooq\nfrom myapp.jobs import queue\n\n"}
RIGS = ("alone", "readme-queue", "sqlalchemy", "django", "alembic-revision", "django-migration")

MODELS = """from django.db import models


class Order(models.Model):
    id = models.IntegerField(primary_key=True)
    paid = models.BooleanField(default=False)

    class Meta:
        db_table = "orders"
        managed = False
"""
SETTINGS = """import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db["dbname"],
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
INSTALLED_APPS = ["myapp"]
SECRET_KEY = "docs-test-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
"""
FIRST_MIGRATION = """from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations: list[migrations.operations.base.Operation] = []
"""
ALEMBIC_ENV = """import os

from alembic import context
from sqlalchemy import create_engine

with create_engine(os.environ["SQLALCHEMY_URL"]).connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
"""


def readme_files() -> dict[str, str]:
    """The README's blocks that are files (first line ``# myapp/jobs.py``), by path."""
    found = {}
    for block in README_SCRIPT:
        match = FILE_COMMENT.match(block.text.splitlines()[0])
        if match:
            found[match[1]] = block.text
    return found


def sqlalchemy_url(dsn: str) -> str:
    """``dsn`` as a ``postgresql+psycopg://`` URL."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return (
        f"postgresql+psycopg://{info['user']}:{info['password']}@{info['host']}:"
        f"{info['port']}/{info['dbname']}"
    )


def prepare(folder: Path, dsn: str) -> dict[str, str]:
    """Write the rig's files into ``folder`` and create the orders table; the environment."""
    for path, text in readme_files().items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    (folder / "myapp" / "__init__.py").touch()
    (folder / "myapp" / "models.py").write_text(MODELS)
    (folder / "docs_settings.py").write_text(SETTINGS)
    return clean_env(
        DATABASE_URL=dsn,
        PYTHONPATH=str(folder),
        SQLALCHEMY_URL=sqlalchemy_url(dsn),
        DJANGO_SETTINGS_MODULE="docs_settings",
    )


def run_python(folder: Path, env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a script in ``folder``; its completed process."""
    (folder / "block.py").write_text(code)
    return subprocess.run(
        [sys.executable, "block.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def script_of(block: Block) -> str:
    """The script that runs ``block`` in its rig (``alone`` … ``django``)."""
    rig, then = rig_of(block)
    if rig == "django":
        body = "import django\n\ndjango.setup()\n\n" + block.text
    else:
        body = PREAMBLE.get(rig, "") + block.text
    return body + (f"\n{then}\n" if then else "")


def alembic(folder: Path, env: dict[str, str], block: Block, *argv: str) -> str:
    """``alembic ARGV`` with ``block`` as the only revision; its output (AssertionError if it
    failed)."""
    versions = folder / "alembic_env" / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    (folder / "alembic_env" / "env.py").write_text(ALEMBIC_ENV)
    (versions / "brooq_tables.py").write_text(block.text)
    (folder / "alembic.ini").write_text("[alembic]\nscript_location = alembic_env\n")
    return _run(folder, env, [sys.executable, "-m", "alembic", "-c", "alembic.ini", *argv])


def django_migrate(folder: Path, env: dict[str, str], block: Block, *argv: str) -> str:
    """``django-admin migrate ARGV`` with ``block`` as myapp's second migration."""
    migrations = folder / "myapp" / "migrations"
    migrations.mkdir(parents=True, exist_ok=True)
    (migrations / "__init__.py").touch()
    (migrations / "0001_initial.py").write_text(FIRST_MIGRATION)
    (migrations / "0002_brooq.py").write_text(block.text)
    return _run(folder, env, [sys.executable, "-m", "django", "migrate", *argv])


def brooq_cli(folder: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """This venv's ``brooq ARGV``; its completed process."""
    return subprocess.run(
        [str(SCRIPTS / "brooq"), *argv],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _run(folder: Path, env: dict[str, str], argv: list[str]) -> str:
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr
