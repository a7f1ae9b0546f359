"""``brooq status``: depth per topic and state, oldest ready age, running jobs with holder and
lease left, dead jobs of the last hour; as text, as JSON, and redrawn with ``--watch``."""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq.cli import main

pytestmark = pytest.mark.db

CLEAR = "\x1b[H\x1b[2J"


def arrange(pg: psycopg.Connection[Any]) -> dict[str, str]:
    """Jobs in several states; the ids of the interesting ones."""

    def insert(sql: str) -> str:
        row = pg.execute(sql + " RETURNING id::text").fetchone()
        assert row is not None
        return str(row[0])

    ids = {
        "ready": insert(
            "INSERT INTO job (topic, payload, available_at) "
            "VALUES ('email.send', '{}', now() - interval '90 seconds')"
        ),
        "later": insert(
            "INSERT INTO job (topic, payload, available_at) "
            "VALUES ('report.build', '{}', now() + interval '1 hour')"
        ),
        "running": insert(
            "INSERT INTO job (topic, payload, state, attempts, locked_by, "
            "locked_until) VALUES ('email.send', '{}', 'processing', 2, "
            "'host-a:4242', now() + interval '45 seconds')"
        ),
        "dead": insert(
            "INSERT INTO job (topic, payload, state, attempts, last_error) "
            "VALUES ('report.build', '{}', 'dead', 5, 'ValueError: no such report')"
        ),
        "old_dead": insert(
            "INSERT INTO job (topic, payload, state, attempts, last_error, "
            "updated_at) VALUES ('report.build', '{}', 'dead', 5, 'old', "
            "now() - interval '2 hours')"
        ),
        "waiting": insert(
            "INSERT INTO job (topic, payload, state, parents_left, if_parent_fails) "
            "VALUES ('report.build', '{}', 'waiting', 1, 'cancel')"
        ),
    }
    pg.execute(
        "INSERT INTO job (topic, payload, state, attempts) "
        "SELECT 'email.send', '{}', 'done', 1 FROM generate_series(1, 3)"
    )
    return ids


def run_status(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    dsn: str,
    *args: str,
) -> str:
    monkeypatch.chdir(tmp_path)  # no stray .env
    monkeypatch.setenv("DATABASE_URL", dsn)
    assert main(["status", *args]) == 0
    out: str = capsys.readouterr().out
    return out


def test_status_text_shows_every_section(
    pg: psycopg.Connection[Any],
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    ids = arrange(pg)
    out = run_status(monkeypatch, capsys, tmp_path, dsn)
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("topic"))
    assert header.split() == [
        "topic",
        "waiting",
        "pending",
        "failed",
        "processing",
        "done",
        "dead",
        "canceled",
        "oldest",
        "ready",
    ]
    email = next(line for line in lines if line.startswith("email.send "))
    assert email.split()[1:8] == ["0", "1", "0", "1", "3", "0", "0"]
    assert email.split()[8].startswith("1m3")  # waited about 90 s
    report = next(line for line in lines if line.startswith("report.build "))
    # later: not ready, and a job waiting for its parents is not ready either
    assert report.split()[1:9] == ["1", "1", "0", "0", "0", "2", "0", "—"]
    assert "running: 1" in out
    running = next(line for line in lines if ids["running"] in line)
    assert "host-a:4242" in running and "email.send" in running
    assert running.split()[3] in {"44s", "45s"}  # lease left
    assert "dead in the last hour: 1" in out
    dead = next(line for line in lines if ids["dead"] in line)
    assert "ValueError: no such report" in dead and "report.build" in dead
    assert ids["old_dead"] not in out


def test_status_json_is_one_object_with_every_section(
    pg: psycopg.Connection[Any],
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    ids = arrange(pg)
    out = run_status(monkeypatch, capsys, tmp_path, dsn, "--json")
    assert len(out.strip().splitlines()) == 1
    data = json.loads(out)
    assert set(data) == {
        "taken_at",
        "depth",
        "oldest_ready_s",
        "rate_limits",
        "paused",
        "running",
        "dead_last_hour",
        "dead_last_hour_total",
        "supervisors",
        "unserved_topics",
        "skipped_supervisors",
        "waiting_by_version",
        "partitions",
    }
    assert data["supervisors"] == [] and data["unserved_topics"] == ["email.send"]
    depth = {(r["topic"], r["state"]): r["jobs"] for r in data["depth"]}
    assert depth == {
        ("email.send", "pending"): 1,
        ("email.send", "processing"): 1,
        ("email.send", "done"): 3,
        ("report.build", "pending"): 1,
        ("report.build", "dead"): 2,
        ("report.build", "waiting"): 1,
    }
    assert set(data["oldest_ready_s"]) == {"email.send"}
    assert 85 <= data["oldest_ready_s"]["email.send"] <= 150
    (running,) = data["running"]
    assert running["id"] == ids["running"] and running["locked_by"] == "host-a:4242"
    assert running["attempts"] == 2 and 40 <= running["lease_left_s"] <= 45
    (dead,) = data["dead_last_hour"]
    assert dead["id"] == ids["dead"] and dead["last_error"] == "ValueError: no such report"
    assert dead["attempts"] == 5 and dead["updated_at"].endswith("+00:00")


def test_status_of_an_empty_queue(
    dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_status(monkeypatch, capsys, tmp_path, dsn)
    assert "no jobs" in out and "running: none" in out and "dead in the last hour: none" in out
    data = json.loads(run_status(monkeypatch, capsys, tmp_path, dsn, "--json"))
    assert data["depth"] == [] and data["running"] == [] and data["dead_last_hour"] == []


def test_watch_with_a_bad_interval_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["status", "--watch", "0"])
    assert exc.value.code == 2
    assert "--watch" in capsys.readouterr().err


def watch(dsn: str, tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "BROOQ_"))}
    env["DATABASE_URL"] = dsn
    return subprocess.Popen(
        [sys.executable, "-m", "brooq.cli", "status", "--watch", "0.2", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def interrupt_after_redraws(
    proc: subprocess.Popen[bytes], marker: str, redraws: int
) -> tuple[str, str]:
    """Read until ``redraws`` frames arrived (bounded), then SIGINT; (stdout, stderr)."""
    assert proc.stdout is not None and proc.stderr is not None
    seen, deadline = b"", time.monotonic() + 15
    while seen.decode(errors="replace").count(marker) < redraws and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            seen += os.read(proc.stdout.fileno(), 65536)
    proc.send_signal(signal.SIGINT)
    try:
        rest, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    return (seen + rest).decode(), err.decode()


@pytest.mark.timeout(60)
def test_watch_redraws_in_place_and_exits_0_on_sigint(
    pg: psycopg.Connection[Any], dsn: str, tmp_path: Path
) -> None:
    arrange(pg)
    proc = watch(dsn, tmp_path)
    out, err = interrupt_after_redraws(proc, CLEAR, 3)
    assert proc.returncode == 0, err
    frames = out.split(CLEAR)[1:]
    assert len(frames) >= 3
    assert all("email.send" in f and "running: 1" in f for f in frames[:3])
    assert "Traceback" not in err


@pytest.mark.timeout(60)
def test_watch_json_prints_one_object_per_refresh(
    pg: psycopg.Connection[Any], dsn: str, tmp_path: Path
) -> None:
    arrange(pg)
    proc = watch(dsn, tmp_path, "--json")
    out, err = interrupt_after_redraws(proc, "\n", 3)
    assert proc.returncode == 0, err
    objects = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(objects) >= 3 and CLEAR not in out
    assert all(len(o["running"]) == 1 for o in objects)


def test_status_with_the_app_lists_its_schedules_and_next_runs(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    dsn: str,
    pg: psycopg.Connection[Any],
) -> None:
    (tmp_path / "schedapp.py").write_text(
        "import os, brooq\n"
        "queue = brooq.Queue(os.environ['DATABASE_URL'])\n"
        "@queue.kind('report.build')\n"
        "def build(claim): pass\n"
        "queue.periodic('*/5 * * * *', topic='report.build')\n"
        "queue.periodic('0 3 * * *', topic='report.build', name='nightly', tz='Europe/Berlin')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = run_status(monkeypatch, capsys, tmp_path, dsn, "--app", "schedapp:queue")
    assert "schedules:" in text and "nightly" in text and "Europe/Berlin" in text
    data = json.loads(
        run_status(monkeypatch, capsys, tmp_path, dsn, "--app", "schedapp:queue", "--json")
    )
    names = [row["name"] for row in data["schedules"]]
    assert names == ["report.build@*/5 * * * *", "nightly"]
    nightly = data["schedules"][1]
    assert nightly["next_run_local"].endswith(("+01:00", "+02:00"))
    assert nightly["next_run_local"][11:16] == "03:00"


def test_status_shows_the_partitions_range_rows_and_size(
    pg: psycopg.Connection[Any],
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    arrange(pg)
    pg.execute("ANALYZE job")  # the rows column is the statistics' estimate
    data = json.loads(run_status(monkeypatch, capsys, tmp_path, dsn, "--json"))
    parts = data["partitions"]
    assert parts[0]["name"] == "job_initial" and parts[0]["starts"] is None
    assert parts[-1] == {**parts[-1], "name": "job_default", "default": True, "ends": None}
    ranges = [p for p in parts if not p["default"]]
    assert all(a["ends"] == b["starts"] for a, b in itertools.pairwise(ranges))
    assert len(ranges) >= 4  # the first, and the days ahead the migration made
    assert sum(p["rows"] for p in parts) == 9 and all(p["bytes"] > 0 for p in parts)
    out = run_status(monkeypatch, capsys, tmp_path, dsn)
    block = out[out.index("partitions:") :]
    assert f"partitions: {len(parts)} (rows are estimates)" in block
    first = next(line for line in block.splitlines() if "job_initial" in line)
    assert "the first" in first and first.split()[-3] == "9"
    assert "ids outside every range" in block


def test_status_shows_each_rate_limit_and_its_tokens(
    pg: psycopg.Connection[Any],
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """What claims recorded in brooq_rate_limit: the limit, the burst, the tokens of the topic's
    own bucket now, and its keys' buckets in use and out of tokens."""
    pg.execute(
        "INSERT INTO brooq_rate_limit (topic, key, rate, per, burst, full_at) VALUES "
        "('api.call', '', 6, '1 minute', 5, clock_timestamp() + interval '25 seconds'), "
        "('tenant.call', '', 2, '1 minute', 2, clock_timestamp() - interval '1 hour'), "
        "('tenant.call', 't1', 2, '1 minute', 2, clock_timestamp() + interval '50 seconds'), "
        "('tenant.call', 't2', 2, '1 minute', 2, clock_timestamp() + interval '10 seconds')"
    )
    data = json.loads(run_status(monkeypatch, capsys, tmp_path, dsn, "--json"))
    rates = {r["topic"]: r for r in data["rate_limits"]}
    assert rates["api.call"]["limit"] == "6/m" and rates["api.call"]["burst"] == 5
    assert 2.5 <= rates["api.call"]["tokens"] <= 2.7  # 2.5 tokens owed, one back every 10 s
    assert (rates["api.call"]["keys"], rates["api.call"]["keys_waiting"]) == (0, 0)
    tenant = rates["tenant.call"]
    assert (tenant["limit"], tenant["tokens"], tenant["keys"], tenant["keys_waiting"]) == (
        "2/m",
        2,
        2,
        1,  # t1 owes 1.7 tokens of 2: none left; t2 owes 0.3: one left
    )
    out = run_status(monkeypatch, capsys, tmp_path, dsn)
    lines = out.splitlines()
    assert "rate limits:" in lines
    api = next(line for line in lines if line.strip().startswith("api.call "))
    assert api.split()[:3] == ["api.call", "6/m", "5"] and api.split()[3] in ("2.5", "2.6")
    assert "rate limits:" not in run_status_empty(monkeypatch, capsys, tmp_path, pg, dsn)


def run_status_empty(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    pg: psycopg.Connection[Any],
    dsn: str,
) -> str:
    """The text status once no topic has a rate limit: the section is left out."""
    pg.execute("DELETE FROM brooq_rate_limit")
    return run_status(monkeypatch, capsys, tmp_path, dsn)
