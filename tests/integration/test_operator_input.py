"""Operator commands cannot be turned against their users (issue 22, items 9, 10, 12, 20).

- an empty or blank filter value (``--topic "$UNSET"``) is refused with exit 2 and
  changes nothing, never read as "every job";
- the bulk ``--reason`` is checked and bounded exactly as ``brooq cancel``'s;
- a topic or id holding a newline or a terminal escape, written by SQL, is escaped in
  every text output (``brooq status``, ``brooq jobs list``);
- bad input is exit 2 everywhere; 1 stays for "not found" / "not allowed in this state".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq.engine.outcome import LAST_ERROR_MAX_CHARS
from tests.integration.test_job_commands import Run, brooq, insert, states

pytestmark = pytest.mark.db
__all__ = ["brooq"]  # the fixture, imported for this module's tests

UNKNOWN_ID = "01900000-0000-7000-8000-000000000000"


@pytest.mark.parametrize("blank", ["", " ", "\t"], ids=["empty", "space", "tab"])
@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "cancel", "--topic", "{}"],
        ["jobs", "retry", "--state", "dead", "--topic", "{}"],
        ["jobs", "purge", "--state", "done", "--topic", "{}"],
        ["jobs", "purge", "--state", "done", "--since", "{}"],
        ["jobs", "purge", "--state", "done", "--until", "{}"],
        ["jobs", "cancel", "--topic", "email.send", "--state", "{}"],
        ["jobs", "list", "--topic", "{}"],
        ["jobs", "list", "--after", "{}"],
        ["jobs", "retry", "{}"],
    ],
    ids=lambda a: " ".join(a[1:]).replace("{}", "BLANK"),
)
def test_a_blank_filter_value_is_refused_and_changes_nothing(
    argv: list[str], blank: str, brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    for state in ("pending", "failed", "dead", "done"):
        insert(pg, "email.send", state, 2, age="2 hours")
        insert(pg, "report.build", state, 2, age="2 hours")
    before = states(pg)
    code, out, err = brooq(*[blank if a == "{}" else a for a in argv])
    assert code == 2, (code, out, err)
    assert "empty" in err and "every job" in err, err
    assert states(pg) == before


def test_an_undecodable_bulk_reason_is_bad_input(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The issue's case: a byte that is not UTF-8 on the command line (exit 70 before)."""
    insert(pg, "email.send", "pending", 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "BROOQ_", "LOG_"))}
    argv = [b"jobs", b"cancel", b"--topic", b"email.send", b"--reason", b"bad \xff byte"]
    code = "import sys; from brooq.cli import main; sys.exit(main())"
    for args in (
        argv,
        [b"cancel", str(insert(pg, "email.send", "pending")[0]).encode(), *argv[4:]],
    ):
        done = subprocess.run(
            [sys.executable.encode(), b"-c", code.encode(), *args],
            env={**env, "DATABASE_URL": dsn},
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
        stderr = done.stderr.decode(errors="replace")
        assert done.returncode == 2, stderr
        assert "--reason" in stderr or "reason" in stderr
        assert "internal error" not in stderr
    assert states(pg) == {"pending": 3}


def test_a_huge_bulk_reason_is_bounded_as_a_single_cancel_bounds_it(
    brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    bulk = insert(pg, "email.send", "pending")[0]
    single = insert(pg, "report.build", "pending")[0]
    reason = "r" * 120_000
    assert brooq("jobs", "cancel", "--topic", "email.send", "--reason", reason)[0] == 0
    assert brooq("cancel", single, "--reason", reason)[0] == 0
    errors = dict(pg.execute("SELECT id::text, last_error FROM job").fetchall())
    assert len(errors[bulk]) == len(errors[single]) <= LAST_ERROR_MAX_CHARS + len("canceled: ")
    assert errors[bulk] == errors[single]
    code, _, err = brooq("jobs", "cancel", "--topic", "email.send", "--reason", "nul \x00 here")
    assert code == 2 and "NUL" in err


FORGED = "evil\n\x1b[2J\x1b[31mdone forged line\x1b[0m\r"


def test_a_forged_topic_is_escaped_in_status_and_jobs_list(
    brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    # A topic no Job would accept, written by SQL: pending, running and dead rows.
    for state in ("pending", "processing", "dead"):
        insert(pg, FORGED, state)
    for argv in (["status"], ["jobs", "list"]):
        code, out, err = brooq(*argv)
        assert code == 0, err
        assert "\x1b" not in out and "\r" not in out, argv
        assert "\\x1b[2J" in out, argv
        assert not any(
            line.startswith("\x1b[31mdone") or line.startswith("[2J") for line in out.splitlines()
        )
        # The forged newline did not start a line of its own.
        assert not any(
            line.lstrip().startswith(("\x1b", "done forged")) for line in out.splitlines()
        )


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["job", "123"], 2),
        (["cancel", "123"], 2),
        (["jobs", "retry", "123"], 2),
        (["jobs", "cancel", "123"], 2),
        (["migrate", "down", "--steps", "0"], 2),
        (["migrate", "down", "--steps", "-1"], 2),
        (["job", UNKNOWN_ID], 1),
        (["cancel", UNKNOWN_ID], 1),
        (["jobs", "retry", UNKNOWN_ID], 1),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_bad_input_exits_2_and_not_found_exits_1(
    argv: list[str], code: int, brooq: Run, pg: psycopg.Connection[Any]
) -> None:
    insert(pg, "email.send", "pending")
    got, out, err = brooq(*argv)
    assert got == code, (out, err)
    assert states(pg) == {"pending": 1}  # migrate down refused before it touched anything
