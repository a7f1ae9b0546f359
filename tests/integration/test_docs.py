"""The documentation's SQL, commands and Python run, as written.

Conventions, for README.md and docs/*.md (a marker is an HTML comment on the
last non-blank line before the fence, invisible when rendered):

- ```` ```sql ````: run with ``psql -X -v ON_ERROR_STOP=1`` against a fresh test
  database holding jobs in every state (see ``seed``). ``<job-id>`` stands for a
  pending job's id, ``<dead-job-id>`` for a dead one's; no other ``<placeholder>``
  may remain. Marked ``<!-- excerpt: PATH -->``, a block is not run but must
  appear in PATH (whitespace aside): SQL quoted from brooq's own files. Marked
  ``<!-- not runnable: why -->`` (a sketch with ``<ready>``-style holes), it is
  left alone; docs/operations.md has no such block.
- ```` ```sh ```` marked ``<!-- runnable -->``: run with ``bash -euo pipefail`` in an
  empty folder, with ``DATABASE_URL`` set to such a database and this venv's
  ``brooq`` first on PATH; each command line must start with ``brooq`` or
  ``psql``; the same placeholders apply. Marked ``<!-- not runnable: why -->``
  (it needs root, systemd, a live host): only ``bash -n``. In docs/*.md every
  sh block carries one of these two markers.
- ```` ```python ```` in docs/*.md: compiled. README.md's Python blocks run in a
  subprocess, in order, as one script; a block whose first line is a comment
  naming a file (``# myapp/jobs.py``) is written to that file instead, which
  the script imports. Afterwards ``brooq work`` runs the job the README enqueued.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.db

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")
PLACEHOLDER = re.compile(r"<[a-z][a-z0-9-]*>")
COMMAND_LINE = re.compile(r"^(brooq|psql)\s")
SCRIPTS = Path(sysconfig.get_path("scripts"))
_SCRUBBED_PREFIXES = ("QUEUE_", "BROOQ_", "LOG_")
_SCRUBBED = {
    "DATABASE_URL",
    "HTTP_ADDR",
    "CREDENTIALS_DIRECTORY",
    "PYTHONPATH",
    "PGDATABASE",
    "PGHOST",
    "PGUSER",
    "PGPASSWORD",
    "PGPORT",
    "PGSERVICE",
}


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str  # the HTML comment before it, or ""

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_doc(self) -> bool:
        return self.path.parent.name == "docs"


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, lang, body = i, match[1], []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{path.name}:{start + 1}: unclosed code block"
        before = next((s.strip() for s in reversed(lines[:start]) if s.strip()), "")
        marker = MARKER.match(before)
        found.append(
            Block(path, start + 1, lang, "\n".join(body) + "\n", marker[1] if marker else "")
        )
        i += 1
    return found


ALL = [b for doc in DOCS for b in blocks(doc)]
SQL = [b for b in ALL if b.lang == "sql" and not b.marker.startswith(("excerpt:", "not runnable:"))]
SQL_SKETCHES = [b for b in ALL if b.lang == "sql" and b.marker.startswith("not runnable:")]
EXCERPTS = [b for b in ALL if b.lang == "sql" and b.marker.startswith("excerpt:")]
SH = [b for b in ALL if b.lang in ("sh", "bash", "shell", "console")]
RUNNABLE_SH = [b for b in SH if b.marker == "runnable"]
OTHER_SH = [b for b in SH if b.marker != "runnable"]
DOC_PYTHON = [b for b in ALL if b.lang == "python" and b.is_doc]
README_PYTHON = [b for b in ALL if b.lang == "python" and b.path.name == "README.md"]


def ids(block: Block) -> str:
    return block.name


# --- the database the snippets run against ---------------------------------------------------


def seed(pg: psycopg.Connection[Any]) -> dict[str, str]:
    """Jobs in every state (one of each, some more); the placeholder values."""
    rows = {
        "pending": ("email.send", "pending", 0, "now()", None, None, None, "order-42"),
        "later": ("email.send", "pending", 0, "now() + interval '1 hour'", None, None, None, None),
        "expired": (
            "report.build",
            "processing",
            1,
            "now() - interval '10 minutes'",
            "host-a:4242",
            "now() - interval '1 minute'",
            None,
            None,
        ),
        "running": (
            "report.build",
            "processing",
            2,
            "now() - interval '1 minute'",
            "host-a:4243",
            "now() + interval '1 minute'",
            "TimeoutError: slow",
            None,
        ),
        "failed": (
            "email.send",
            "failed",
            3,
            "now() - interval '5 seconds'",
            "host-a:4244",
            "now() - interval '1 minute'",
            "SMTPError: 451 try later",
            None,
        ),
        "done": (
            "email.send",
            "done",
            1,
            "now() - interval '40 days'",
            "host-a:4245",
            "now() - interval '40 days'",
            None,
            None,
        ),
        "dead": (
            "report.build",
            "dead",
            5,
            "now() - interval '1 hour'",
            "host-a:4246",
            "now() - interval '1 hour'",
            "ValueError: no such report",
            None,
        ),
        "canceled": ("email.send", "canceled", 0, "now()", None, None, "canceled: test", None),
    }
    ids: dict[str, str] = {}
    for name, (topic, state, attempts, at, by, until, error, key) in rows.items():
        old = name == "done"
        row = pg.execute(
            f"INSERT INTO job (topic, payload, state, attempts, available_at, locked_by, "
            f"locked_until, last_error, idempotency_key, created_at, updated_at) "
            f"VALUES (%s, %s, %s, %s, {at}, %s, {until or 'NULL'}, %s, %s, "
            f"{'now() - interval ' + repr('40 days') if old else 'now()'}, "
            f"{'now() - interval ' + repr('40 days') if old else 'now()'}) RETURNING id",
            (topic, '{"to": "a@example.com"}', state, attempts, by, error, key),
        ).fetchone()
        assert row is not None
        ids[name] = str(row[0])
    return {"<job-id>": ids["pending"], "<dead-job-id>": ids["dead"]}


def fill(block: Block, values: dict[str, str]) -> str:
    text = block.text
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    left = PLACEHOLDER.findall(text)
    assert not left, f"{block.name}: unknown placeholders {left}"
    return text


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)
    }
    env["PATH"] = f"{SCRIPTS}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def psql() -> str:
    found = shutil.which("psql")
    assert found, "psql is missing (Debian's postgresql-client; scripts/pg.sh installs it)"
    return found


# --- the conventions hold -------------------------------------------------------------------


def test_the_documents_have_what_this_module_tests() -> None:
    ops = ROOT / "docs" / "operations.md"
    assert not [b.name for b in SQL_SKETCHES if b.path == ops], "operations.md SQL must run"
    assert EXCERPTS and DOC_PYTHON
    assert sum(1 for b in SQL if b.path == ops) >= 10
    assert sum(1 for b in RUNNABLE_SH if b.path == ops) >= 3
    assert len(README_PYTHON) >= 3


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


@pytest.mark.parametrize("block", DOC_PYTHON, ids=ids)
def test_python_blocks_of_the_docs_compile(block: Block) -> None:
    compile(block.text, block.name, "exec")


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


FILE_COMMENT = re.compile(r"^#\s*([\w./-]+\.py)\s*$")


@pytest.mark.timeout(120)
def test_readme_python_runs_and_its_job_gets_done(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    script: list[str] = []
    for block in README_PYTHON:
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
    assert pg.execute("SELECT id FROM orders").fetchall() == [(42,)]
    row = pg.execute("SELECT topic, state FROM job WHERE idempotency_key = 'order-42'").fetchone()
    assert row == ("email.send", "pending")

    # "Run the handlers": the README's `brooq work --app myapp.jobs:queue`, until idle.
    done = subprocess.run(
        [str(SCRIPTS / "brooq"), "work", "--app", "myapp.jobs:queue", "--exit-when-idle"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sending to a@example.com" in done.stdout
    row = pg.execute(
        "SELECT state, attempts FROM job WHERE idempotency_key = %s", ("order-42",)
    ).fetchone()
    assert row == ("done", 1)
