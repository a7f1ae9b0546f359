"""The documentation's SQL, commands and Python run, as written.

Conventions, for README.md and docs/*.md (a marker is an HTML comment on the
last non-blank line before the fence, invisible when rendered):

- ```` ```sql ````: run with ``psql -X -v ON_ERROR_STOP=1`` against a fresh test
  database holding jobs in every state (see ``seed``). ``<job-id>`` stands for a
  pending job's id, ``<dead-job-id>`` for a dead one's; no other ``<placeholder>``
  may remain. Marked ``<!-- excerpt: PATH -->``, a block is not run but must
  appear in PATH (whitespace aside): SQL quoted from brooq's own files. Marked
  ``<!-- not runnable: why -->`` (a sketch with ``<ready>``-style holes), it is
  left alone; docs/operations.md has no such block. Marked ``<!-- grants: ROLE -->``:
  the roles and grants of docs/operations.md, run as ROLE by
  ``test_the_documented_grants_are_enough``.
- ```` ```sh ```` marked ``<!-- runnable -->``: run with ``bash -euo pipefail`` in an
  empty folder, with ``DATABASE_URL`` set to such a database and this venv's
  ``brooq`` first on PATH; each command line must start with ``brooq`` or
  ``psql``; the same placeholders apply. Marked ``<!-- not runnable: why -->``
  (it needs root, systemd, a live host): only ``bash -n``. In docs/*.md every
  sh block carries one of these two markers.
- ```` ```python ````: README.md's unmarked blocks run in a subprocess, in order, as
  one script; a block whose first line is a comment naming a file
  (``# myapp/jobs.py``) is written to that file instead, which the script imports.
  Afterwards ``brooq work`` runs the job the README enqueued. A block a reader
  copies on its own is marked ``<!-- runs: RIG -->`` (or ``<!-- runs: RIG; then
  EXPRESSION -->``) and runs alone in that rig (tests/integration/docs_rigs.py):
  ``alone``, ``readme-queue``, ``sqlalchemy``, ``django``, and the migration files
  ``alembic-revision`` and ``django-migration``, which migrate an empty database
  that ``brooq status`` then accepts. In docs/*.md every Python block is marked
  ``runs:`` or ``not runnable: why``.
- ```` ```ini ```` marked ``<!-- pgbouncer.ini -->``: loaded by a real PgBouncer
  (Debian's), which brooq then drains jobs through.
- Every ``brooq.x.y`` the documents name is importable; README's layout names
  files that exist.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from tests.integration.docs_blocks import (
    ALL,
    DOC_PYTHON,
    DOCS,
    EXCERPTS,
    GRANTS,
    OTHER_SH,
    PGBOUNCER_INI,
    README_SCRIPT,
    ROOT,
    RUNNABLE_SH,
    SH,
    SQL,
    SQL_SKETCHES,
    STANDALONE,
    Block,
    brooq_names,
    clean_env,
    fill,
    ids,
    psql,
    resolves,
    rig_of,
    seed,
)
from tests.integration.docs_deploy import (
    SUPERVISE,
    DocumentedBouncer,
    as_role,
    documented_settings,
    run_sql,
    supervise_one_job,
)
from tests.integration.docs_rigs import (
    FILE_COMMENT,
    ORDERS,
    RIGS,
    alembic,
    brooq_cli,
    django_migrate,
    prepare,
    run_python,
    script_of,
)

pytestmark = pytest.mark.db

COMMAND_LINE = re.compile(r"^(brooq|psql)\s")
MIGRATION_RIGS = ("alembic-revision", "django-migration")


# --- the conventions hold -------------------------------------------------------------------


def test_the_documents_have_what_this_module_tests() -> None:
    ops = ROOT / "docs" / "operations.md"
    assert not [b.name for b in SQL_SKETCHES if b.path == ops], "operations.md SQL must run"
    assert EXCERPTS and DOC_PYTHON
    assert sum(1 for b in SQL if b.path == ops) >= 10
    assert sum(1 for b in RUNNABLE_SH if b.path == ops) >= 3
    assert len(README_SCRIPT) >= 3
    assert set(GRANTS) == {"superuser", "brooq_migrate"}
    assert len(PGBOUNCER_INI) == 1
    assert {rig_of(b)[0] for b in STANDALONE} >= {"alone", "sqlalchemy", "django", *MIGRATION_RIGS}


@pytest.mark.parametrize("block", [b for b in SH if b.is_doc], ids=ids)
def test_every_sh_block_of_the_docs_says_whether_it_runs(block: Block) -> None:
    assert block.marker == "runnable" or block.marker.startswith("not runnable:"), (
        f"{block.name}: mark it <!-- runnable --> or <!-- not runnable: why -->"
    )


@pytest.mark.parametrize("block", RUNNABLE_SH, ids=ids)
def test_runnable_sh_blocks_hold_only_brooq_and_psql(block: Block) -> None:
    for line in block.text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            assert COMMAND_LINE.match(line), f"{block.name}: {line!r} is not a brooq/psql command"


@pytest.mark.parametrize("block", OTHER_SH, ids=ids)
def test_other_sh_blocks_are_valid_shell(block: Block) -> None:
    text = block.text.replace("<", "_").replace(">", "_") if "<" in block.text else block.text
    done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{block.name}: {done.stderr}"


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "python"], ids=ids)
def test_python_blocks_compile_and_say_how_they_run(block: Block) -> None:
    compile(block.text, block.name, "exec")
    if block.is_doc or block.marker:
        assert block.marker.startswith(("runs:", "not runnable:")), (
            f"{block.name}: mark it <!-- runs: RIG --> or <!-- not runnable: why -->"
        )
    if block.marker.startswith("runs:"):
        assert rig_of(block)[0] in RIGS, f"{block.name}: no rig {rig_of(block)[0]!r} ({RIGS})"


def test_every_brooq_name_the_documents_give_is_importable() -> None:
    named = {(doc.relative_to(ROOT), name) for doc in DOCS for name in brooq_names(doc.read_text())}
    assert len(named) > 20
    missing = sorted(f"{doc}: {name}" for doc, name in named if not resolves(name))
    assert not missing, missing


def test_the_readme_layout_names_what_exists() -> None:
    (layout,) = [b for b in ALL if b.path.name == "README.md" and b.text.startswith("brooq/")]
    for line in layout.text.splitlines():
        path, _, words = line.partition(" ")
        assert (ROOT / path).exists(), line
        for name in re.findall(r"[\w]+\.py", words):
            assert (ROOT / path / name).exists() or (ROOT / "brooq" / name).exists(), line


def test_operations_says_how_many_retention_batches_a_pass_deletes() -> None:
    from brooq.engine.retention import RETENTION_MAX_BATCHES
    from brooq.supervisor.maintenance import RETENTION_BATCHES_PER_TASK

    text = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert f"at most {RETENTION_BATCHES_PER_TASK} batches a pass" in text
    assert f"(`brooq work`: {RETENTION_MAX_BATCHES})" in text


def test_operations_lists_every_metric() -> None:
    from brooq import metrics

    names = set(re.findall(r'"(brooq_[a-z_]+)"', Path(metrics.__file__).read_text()))
    text = (ROOT / "docs" / "operations.md").read_text()
    assert names and not [n for n in sorted(names) if f"| `{n}` |" not in text]


@pytest.mark.parametrize("block", EXCERPTS, ids=ids)
def test_sql_excerpts_are_quoted_exactly(block: Block) -> None:
    source = ROOT / block.marker.removeprefix("excerpt:").strip()
    assert source.is_file(), f"{block.name}: no file {source}"

    def squash(text: str) -> str:
        return " ".join(text.split())

    assert squash(block.text) in squash(source.read_text()), (
        f"{block.name} is not an excerpt of {source.relative_to(ROOT)}"
    )


# --- running them ---------------------------------------------------------------------------


@pytest.mark.parametrize("block", SQL, ids=ids)
def test_sql_block_runs(
    block: Block, dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    script = tmp_path / "block.sql"
    script.write_text(fill(block, seed(pg)))
    done = subprocess.run(
        [psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert done.returncode == 0, f"{block.name}:\n{block.text}\n{done.stderr}"
    assert "ERROR" not in done.stderr and "WARNING" not in done.stderr, done.stderr


@pytest.mark.parametrize("block", RUNNABLE_SH, ids=ids)
def test_runnable_sh_block_runs(
    block: Block, dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    psql()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", fill(block, seed(pg))],
        cwd=tmp_path,
        env=clean_env(DATABASE_URL=dsn),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.name}:\n{block.text}\n{done.stdout}\n{done.stderr}"


@pytest.mark.timeout(120)
def test_readme_python_runs_and_its_job_gets_done(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    script: list[str] = []
    for block in README_SCRIPT:
        first = block.text.splitlines()[0]
        if match := FILE_COMMENT.match(first):
            target = tmp_path / match[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
        else:
            script.append(f"# --- {block.name}\n{block.text}")
    (tmp_path / "readme.py").write_text("\n".join(script))
    env = clean_env(DATABASE_URL=dsn, PYTHONPATH=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "readme.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    # What the README says happened did happen: the order and its job, committed together.
    assert pg.execute("SELECT id, paid FROM orders").fetchall() == [(42, False)]
    row = pg.execute("SELECT topic, state FROM job WHERE idempotency_key = 'order-42'").fetchone()
    assert row == ("email.send", "pending")

    # "Run the handlers": the README's `brooq work --app myapp.jobs:queue`, until idle.
    done = brooq_cli(tmp_path, env, "work", "--app", "myapp.jobs:queue", "--exit-when-idle")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sending to a@example.com" in done.stdout
    row = pg.execute(
        "SELECT state, attempts FROM job WHERE idempotency_key = %s", ("order-42",)
    ).fetchone()
    assert row == ("done", 1)


@pytest.mark.parametrize(
    "block", [b for b in STANDALONE if rig_of(b)[0] not in MIGRATION_RIGS], ids=ids
)
def test_a_block_a_reader_copies_runs_on_its_own(
    block: Block, dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    env = prepare(tmp_path, dsn)
    pg.execute(ORDERS)
    done = run_python(tmp_path, env, script_of(block))
    assert done.returncode == 0, f"{block.name}:\n{done.stdout}\n{done.stderr}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "block", [b for b in STANDALONE if rig_of(b)[0] in MIGRATION_RIGS], ids=ids
)
def test_a_migration_snippet_builds_a_schema_brooq_accepts(
    block: Block, empty_dsn: str, tmp_path: Path
) -> None:
    env = prepare(tmp_path, empty_dsn)
    if rig_of(block)[0] == "alembic-revision":
        alembic(tmp_path, env, block, "upgrade", "head")
    else:
        django_migrate(tmp_path, env, block, "myapp")
    done = brooq_cli(tmp_path, env, "status")
    assert done.returncode == 0, f"{block.name}: {done.stderr}"
    done = brooq_cli(tmp_path, env, "enqueue", "--topic", "email.send", "--payload", "{}")
    assert done.returncode == 0, f"{block.name}: {done.stderr}"
    if rig_of(block)[0] == "alembic-revision":
        alembic(tmp_path, env, block, "downgrade", "base")
    else:
        django_migrate(tmp_path, env, block, "myapp", "0001")
    with psycopg.connect(empty_dsn) as conn:
        left = conn.execute("SELECT to_regclass('job'), to_regclass('brooq_supervisor')")
        assert left.fetchone() == (None, None)


# --- the deployment the docs describe ---------------------------------------------------------


@pytest.fixture
def doc_roles(admin_url: str) -> Iterator[dict[str, str]]:
    """Names for the documented roles, unique to this run, dropped at teardown (after the
    test's database, so nothing of theirs is left)."""
    suffix = f"_t{secrets.token_hex(3)}"
    roles = {"brooq_migrate": f"brooq_migrate{suffix}", "brooq_run": f"brooq_run{suffix}"}
    yield roles
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role in roles.values():
            conn.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


@pytest.mark.timeout(180)
def test_the_documented_grants_are_enough(
    doc_roles: dict[str, str], empty_dsn: str, admin_url: str, tmp_path: Path
) -> None:
    """docs/operations.md's two roles, with exactly its grants: the migrating role migrates,
    the running role runs status, workers, migrate status, enqueue and a supervisor."""
    passwords = {role: secrets.token_hex(12) for role in doc_roles}

    def as_documented(block: Block) -> str:
        text = re.sub(r"\bbrooq_(migrate|run)\b", lambda m: doc_roles[m[0]], block.text)
        text = text.replace("<migrate-password>", passwords["brooq_migrate"])
        return text.replace("<run-password>", passwords["brooq_run"])

    dbname = str(psycopg.conninfo.conninfo_to_dict(empty_dsn)["dbname"])
    admin = psycopg.conninfo.make_conninfo(admin_url, dbname=dbname)
    migrate = as_role(empty_dsn, doc_roles["brooq_migrate"], passwords["brooq_migrate"])
    run = as_role(empty_dsn, doc_roles["brooq_run"], passwords["brooq_run"])
    run_sql(admin, as_documented(GRANTS["superuser"]))
    env = prepare(tmp_path, migrate)
    assert brooq_cli(tmp_path, env, "migrate", "up").returncode == 0
    run_sql(migrate, as_documented(GRANTS["brooq_migrate"]))

    env = prepare(tmp_path, run)
    for argv in (
        ["status"],
        ["workers"],
        ["migrate", "status"],
        ["enqueue", "--topic", "email.send", "--payload", '{"to": "a@example.com", "body": "x"}'],
    ):
        done = brooq_cli(tmp_path, env, *argv)
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    text = supervise_one_job(tmp_path, env, owner=migrate)
    assert "permission denied" not in text and "level=error" not in text, text
    workers = brooq_cli(tmp_path, env, "workers", "--all")
    assert workers.returncode == 0, workers.stderr

    # One grant less: a clear message and exit 2, not an internal error.
    run_sql(migrate, f"REVOKE SELECT ON brooq_supervisor FROM {doc_roles['brooq_run']}")
    done = brooq_cli(tmp_path, env, "workers")
    assert done.returncode == 2, done.stderr
    assert "lacks a privilege" in done.stderr and "brooq_supervisor" in done.stderr
    # The supervisor checks before it forks (it logged a failed `register` every 5 s).
    done = brooq_cli(tmp_path, {**env, "HTTP_ADDR": "127.0.0.1:0"}, *SUPERVISE)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "lacks SELECT, INSERT, UPDATE, DELETE on brooq_supervisor" in done.stderr


@pytest.mark.timeout(120)
def test_the_documented_pgbouncer_ini_loads_and_brooq_works_through_it(
    server_url: str, dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    (block,) = PGBOUNCER_INI
    dbname = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    bouncer = DocumentedBouncer(server_url, block, dbname)
    bouncer.start()
    try:
        in_force = bouncer.in_force()
        for key, value in documented_settings(block).items():
            if key not in ("listen_addr", "listen_port", "auth_file"):
                assert in_force[key] == value, (key, in_force[key], value)
        url = f"postgresql://{bouncer.user}:{bouncer.password}@127.0.0.1:{bouncer.port}/app"
        env = prepare(tmp_path, url)
        env.update(QUEUE_PGBOUNCER="true", QUEUE_POLL_INTERVAL="1s")  # the documented brooq.env
        payload = '{"to": "a@example.com", "body": "through the bouncer"}'
        for argv in (["enqueue", "--topic", "email.send", "--payload", payload], ["status"]):
            done = brooq_cli(tmp_path, env, *argv)
            assert done.returncode == 0, f"{argv}: {done.stderr}"
        done = brooq_cli(tmp_path, env, "work", "--app", "myapp.jobs:queue", "--exit-when-idle")
        assert done.returncode == 0, done.stderr
        assert pg.execute("SELECT state FROM job").fetchall() == [("done",)]
    finally:
        bouncer.stop()
