"""The code blocks of README.md and docs/*.md, and what running them needs.

A marker is an HTML comment on the last non-blank line before a fence,
invisible when rendered; tests/integration/test_docs.py says what each means.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")
PLACEHOLDER = re.compile(r"<[a-z][a-z0-9-]*>")
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
    "SQLALCHEMY_URL",
    "DJANGO_SETTINGS_MODULE",
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
SQL = [
    b
    for b in ALL
    if b.lang == "sql" and not b.marker.startswith(("excerpt:", "not runnable:", "grants:"))
]
GRANTS = {
    b.marker.removeprefix("grants:").strip(): b for b in ALL if b.marker.startswith("grants:")
}
SQL_SKETCHES = [b for b in ALL if b.lang == "sql" and b.marker.startswith("not runnable:")]
EXCERPTS = [b for b in ALL if b.lang == "sql" and b.marker.startswith("excerpt:")]
SH = [b for b in ALL if b.lang in ("sh", "bash", "shell", "console")]
RUNNABLE_SH = [b for b in SH if b.marker == "runnable"]
OTHER_SH = [b for b in SH if b.marker != "runnable"]
PYTHON = [b for b in ALL if b.lang == "python"]
DOC_PYTHON = [b for b in PYTHON if b.is_doc]
README_SCRIPT = [b for b in PYTHON if b.path.name == "README.md" and not b.marker]
STANDALONE = [b for b in PYTHON if b.marker.startswith("runs:")]
PGBOUNCER_INI = [b for b in ALL if b.marker == "pgbouncer.ini"]


def rig_of(block: Block) -> tuple[str, str]:
    """``<!-- runs: RIG -->`` or ``<!-- runs: RIG; then EXPRESSION -->``: (RIG, EXPRESSION)."""
    rig, _, then = block.marker.removeprefix("runs:").partition(";")
    return rig.strip(), then.strip().removeprefix("then").strip()


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


# Not a file name (brooq.service) nor a key (brooq.max_running:<topic>).
_NAMED = re.compile(r"(?<![\w/.-])brooq(?:\.[A-Za-z_]\w*)+(?![\w:])")
_FILE_SUFFIXES = ("service", "env", "yml", "yaml", "json", "toml", "ini", "sql", "py", "md")


def brooq_names(text: str) -> set[str]:
    """Every dotted ``brooq.x.y`` name ``text`` gives (file names aside)."""
    return {m[0] for m in _NAMED.finditer(text) if m[0].rsplit(".", 1)[-1] not in _FILE_SUFFIXES}


def resolves(dotted: str) -> bool:
    """True when ``dotted`` is a module, or an attribute reached from the longest module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False
