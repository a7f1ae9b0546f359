"""The first hour with brooq, without traps (issue 15, item 4): one test per trap.

- an unmigrated database: one line, "the job table is missing: run `brooq
  migrate up`", and exit 2 from every command, no traceback;
- ``brooq`` with no command prints the command list; every option has help;
- a settled row does not look locked;
- ``--workers`` above what the database allows is refused;
- ``make demo`` ends with commands that work when pasted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq.cli import parser
from tests.system.harness import PYTHONPATH, run_cli

pytestmark = pytest.mark.db

MISSING = "the job table is missing: run `brooq migrate up`"
SOME_ID = "0190f4c4-7a55-7c1e-8f00-000000000001"
EVERY_COMMAND = [
    ["enqueue", "--topic", "email.send", "--payload", "{}"],
    ["job", SOME_ID],
    ["cancel", SOME_ID],
    ["jobs", "list"],
    ["jobs", "retry", SOME_ID],
    ["jobs", "retry", "--state", "dead"],
    ["jobs", "cancel", "--topic", "email.send"],
    ["jobs", "purge", "--state", "done"],
    ["status"],
    ["workers"],
    ["work", "--app", "sysapp:queue"],
    ["supervise", "--app", "sysapp:queue", "--workers", "1"],
    ["dashboard", "--http-addr", "127.0.0.1:0"],
]


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=lambda a: " ".join(a[:2]))
def test_an_unmigrated_database_gives_one_line_and_exit_2(
    empty_dsn: str, tmp_path: Path, args: list[str]
) -> None:
    done = run_cli(empty_dsn, tmp_path, *args, timeout=30)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [MISSING], done.stderr
    assert done.stdout == ""


def test_brooq_with_no_command_prints_the_command_list(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "brooq.cli"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    for command in (
        "migrate",
        "enqueue",
        "job",
        "jobs",
        "status",
        "workers",
        "work",
        "supervise",
        "dashboard",
    ):
        assert re.search(rf"^\s+{command}\s+\S", done.stdout, re.MULTILINE), command
    jobs = subprocess.run(
        [sys.executable, "-m", "brooq.cli", "jobs"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        capture_output=True,
        text=True,
        timeout=30,
    )
    for action in ("list", "retry", "cancel", "purge"):
        assert re.search(rf"^\s+{action}\s+\S", jobs.stdout, re.MULTILINE), action


def _parsers(
    p: argparse.ArgumentParser, name: str = "brooq"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, p)]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += _parsers(sub, f"{name} {sub_name}")
    return found


def test_every_option_and_command_has_help() -> None:
    missing = []
    for name, p in _parsers(parser()):
        for action in p._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_a_settled_row_does_not_look_locked(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # The last holder stays in the row for diagnosis; shown, it must not read as a lock.
    (job_id,) = pg.execute(
        "INSERT INTO job (topic, payload, state, attempts, locked_by, locked_until) "
        "VALUES ('email.send', '{}', 'done', 1, 'host-a:1:x', now() + interval '1 minute') "
        "RETURNING id::text"
    ).fetchone() or ("",)
    shown = run_cli(dsn, tmp_path, "job", job_id).stdout
    fields: dict[str, str] = {}
    for line in shown.splitlines():
        key, _, value = line.partition(" ")
        fields[key] = value
    assert "locked_by" not in fields and fields["last_holder"].strip() == "host-a:1:x"
    assert fields["locked_until"].strip() == ""
    as_json = json.loads(run_cli(dsn, tmp_path, "job", job_id, "--json").stdout)
    assert (as_json["locked_by"], as_json["locked_until"]) == (None, None)
    assert as_json["last_holder"] == "host-a:1:x"
    running = pg.execute(
        "INSERT INTO job (topic, payload, state, attempts, locked_by, locked_until) "
        "VALUES ('email.send', '{}', 'processing', 1, 'host-a:1:x', now() + interval '1 minute')"
        " RETURNING id::text"
    ).fetchone()
    assert running is not None
    shown = run_cli(dsn, tmp_path, "job", running[0]).stdout
    assert re.search(r"^locked_by\s+host-a:1:x$", shown, re.MULTILINE)
    assert re.search(r"^locked_until\s+\d{4}-", shown, re.MULTILINE)


def test_more_workers_than_the_database_allows_is_refused(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    row = pg.execute("SELECT current_setting('max_connections')::int").fetchone()
    assert row is not None
    too_many = row[0] + 10
    done = run_cli(
        dsn, tmp_path, "supervise", "--app", "sysapp:queue", "--workers", str(too_many), timeout=30
    )
    assert done.returncode == 2, done.stderr
    assert f"--workers {too_many}" in done.stderr and "max_connections" in done.stderr
    assert "lower --workers to at most" in done.stderr
    assert "Traceback" not in done.stderr


def test_make_demo_ends_with_commands_that_work_when_pasted(dsn: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "BROOQ_"))}
    env.update({"DATABASE_URL": dsn, "PYTHONPATH": PYTHONPATH})
    done = subprocess.run(
        [sys.executable, "-m", "brooq.demo", "--jobs", "30"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "dead jobs here are intended" in out
    tail = out[out.index("paste these") :].splitlines()[1:]
    commands = [line.strip() for line in tail if line.strip()]
    assert any(c.startswith("export DATABASE_URL=") for c in commands)
    # The venv first: from then on `brooq`, `python` and `pip` are the venv's (issue 27).
    assert commands[0].startswith(". ") and commands[0].split()[1].endswith("/bin/activate")
    assert any(c.startswith("brooq status") for c in commands)
    assert any(" status" in c for c in commands) and any(" jobs list" in c for c in commands)
    script = "set -e\n" + "\n".join(c for c in commands if "dashboard" not in c)
    pasted = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={k: v for k, v in env.items() if k != "DATABASE_URL"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr
    assert "dead" in pasted.stdout
    assert json.loads(pasted.stdout.splitlines()[-1])["retried"] >= 0


def test_env_example_says_how_to_point_dot_env_at_the_local_database(tmp_path: Path) -> None:
    """Issue 27: .env.example hard-coded port 55433 whatever BROOQ_PGPORT chose; its first
    lines give the command that writes the local database's real URL into .env."""
    root = Path(__file__).resolve().parents[2]
    header = (root / ".env.example").read_text().splitlines()[:5]
    (command,) = [
        line.lstrip("# ").strip() for line in header if line.lstrip("# ").startswith("cp ")
    ]
    assert "scripts/pg.sh url" in command
    (tmp_path / ".env.example").write_text((root / ".env.example").read_text())
    (tmp_path / "scripts").symlink_to(root / "scripts")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    subprocess.run(["bash", "-euc", command], cwd=tmp_path, env=env, check=True, timeout=60)
    url = subprocess.run(
        [str(root / "scripts" / "pg.sh"), "url"], env=env, capture_output=True, text=True
    ).stdout.strip()
    shown = subprocess.run(
        [sys.executable, "-m", "brooq.cli", "config", "show", "--format", "env"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": PYTHONPATH},
        capture_output=True,
        text=True,
        timeout=60,
    )
    port = psycopg.conninfo.conninfo_to_dict(url)["port"]
    assert f"@127.0.0.1:{port}/" in shown.stdout, shown.stdout + shown.stderr


def test_global_flags_are_accepted_after_the_command_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27: `brooq config show --config x.toml` was refused (only `brooq --config x.toml
    config show` worked); users type it after the command."""
    from brooq.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("QUEUE_LEASE", raising=False)
    (tmp_path / "a.toml").write_text('lease = "3m"\n')
    (tmp_path / "b.toml").write_text('lease = "7m"\n')
    assert main(["config", "show", "--config", "a.toml"]) == 0
    assert "QUEUE_LEASE=3m" in capsys.readouterr().out
    assert main(["--config", "a.toml", "config", "show"]) == 0
    assert "QUEUE_LEASE=3m" in capsys.readouterr().out
    # After the command wins over before it; absent after it, the one before stays.
    assert main(["--config", "a.toml", "config", "show", "--config", "b.toml"]) == 0
    assert "QUEUE_LEASE=7m" in capsys.readouterr().out
    assert main(["--log-level", "debug", "config", "show", "--format", "env"]) == 0
    assert "LOG_LEVEL=debug" in capsys.readouterr().out
    with pytest.raises(SystemExit) as parsed:
        parser().parse_args(["jobs", "list", "--config"])  # the flag needs its FILE
    assert parsed.value.code == 2
