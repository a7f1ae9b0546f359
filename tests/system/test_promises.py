"""Documented promises, held by real supervisors: a host that dies does not use up attempts, a
job that keeps killing its host ends ``dead`` through the reaper, and settings that would break
at run time are refused at start.

Real ``brooq supervise`` processes (apps/sysapp_promises.py), real SIGKILLs, real PostgreSQL;
every wait is bounded.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import insert_jobs, run_cli, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = "sysapp_promises:queue"
# A short lease and a reaper that looks every second: an expired lease comes back in ~3 s.
ARGS = ("--workers", "1", "--lease", "2s", "--poll-interval", "200ms", "--graceful-timeout", "3s")
ENV = {"QUEUE_REAPER_PERIOD": "1s", "QUEUE_LOG_JOBS": "true"}  # JobClaimed says where it ran


def row(pg: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    """The columns of one job that say how often it ran and why it stopped."""
    cur = pg.execute(
        "SELECT state, attempts, expirations, last_error, locked_by FROM job WHERE id = %s",
        (job_id,),
    )
    found = cur.fetchone()
    assert found is not None, f"no job {job_id}"
    return dict(zip([d.name for d in cur.description or []], found, strict=True))


def runs(trace: Path) -> list[dict[str, Any]]:
    """The runs a handler wrote down (start lines only)."""
    if not trace.exists():
        return []
    lines = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    return [line for line in lines if not line.get("end")]


@pytest.mark.timeout(90)
def test_a_host_death_does_not_use_up_an_attempt_max_attempts_2(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """max_attempts=2: host death, then a real failure → ``failed`` (retry scheduled), not
    ``dead``; ``dead`` only after a second recorded failure."""
    trace, hold = tmp_path / "trace", tmp_path / "held"
    first = supervise(*ARGS, app=APP, env=ENV, name="first")
    first.wait_children(1)
    (job_id,) = insert_jobs(
        pg, "fragile", [{"trace": str(trace), "hold_once": str(hold), "fail": "boom"}]
    )
    wait_until(lambda: first.child_running(job_id), 15, "the first run to start")
    wait_until(hold.exists, 5, "the handler to hold the job")
    first.send(signal.SIGKILL)  # the whole host goes: supervisor and (with it) its worker
    assert first.wait_exit(5) == -signal.SIGKILL
    held = row(pg, job_id)
    assert (held["state"], held["attempts"], held["expirations"]) == ("processing", 1, 0), held

    second = supervise(*ARGS, app=APP, env=ENV, name="second")
    failed = wait_until(
        lambda: (r := row(pg, job_id))["state"] != "processing" and r["attempts"] == 2 and r,
        30,
        "the second run to be recorded",
    )
    # Before: the expiry used up attempt 1 of 2, so this failure made the job dead.
    assert failed["state"] == "failed", failed
    assert failed["attempts"] == 2 and failed["expirations"] == 1, failed
    assert failed["last_error"] == "RuntimeError: boom", failed

    dead = wait_until(
        lambda: (r := row(pg, job_id))["state"] == "dead" and r,
        20,
        "the second recorded failure to make it dead",
    )
    assert dead["attempts"] == 3 and dead["expirations"] == 1, dead  # charged: 2 = max
    assert dead["last_error"] == "RuntimeError: boom", dead
    assert [(r["attempt"], r["expirations"]) for r in runs(trace)] == [(1, 0), (1, 1), (2, 1)]
    assert sum(e["count"] for e in second.events("JobRequeued")) == 1
    assert [e["attempt"] for e in second.events("JobFailed", job_id=job_id)] == [1]
    assert second.stop() == 0


@pytest.mark.timeout(120)
def test_a_job_that_kills_its_host_every_time_ends_dead_through_the_reaper(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """QUEUE_MAX_EXPIRATIONS=3: three supervisors die running it; the fourth's reaper moves
    it to ``dead`` with the documented reason, without running it again."""
    limit = 3
    env = {**ENV, "QUEUE_MAX_EXPIRATIONS": str(limit)}
    trace = tmp_path / "trace"
    (job_id,) = insert_jobs(pg, "host-killer", [{"trace": str(trace), "kill_host": True}])
    holders = []
    for death in range(1, limit + 1):
        sup = supervise(*ARGS, app=APP, env=env, name=f"host{death}")
        holders.append(sup.wait_event("SupervisorStarted", 20)["holder"])
        assert sup.wait_exit(30) == -signal.SIGKILL, sup.log_tail()
        held = row(pg, job_id)
        assert held["state"] == "processing", held
        assert (held["attempts"], held["expirations"]) == (death, death - 1), held
        assert held["locked_by"] == holders[-1]
        assert sup.events("JobClaimed", job_id=job_id)  # it ran there (the log says so)

    last = supervise(*ARGS, app=APP, env=env, name="survivor")
    dead = wait_until(
        lambda: (r := row(pg, job_id))["state"] == "dead" and r,
        20,
        "the reaper to move the job to dead",
    )
    assert dead["attempts"] == limit and dead["expirations"] == limit, dead
    assert dead["last_error"] == (
        f"lease expired {limit} times in a row: its holder died every time it ran "
        f"(last holder {holders[-1]}); the job may be killing its host"
    ), dead
    moved = last.wait_event("JobDead", 5, logger="brooq.reaper", topic="host-killer")
    assert moved["count"] == 1
    # It never ran again: one run per dead host, each on its first charged attempt.
    assert [(r["attempt"], r["expirations"]) for r in runs(trace)] == [(1, 0), (1, 1), (1, 2)]
    assert last.events("JobClaimed", job_id=job_id) == []
    assert not last.exited()
    assert last.stop() == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("command", ["supervise", "work"])
def test_durations_past_365_days_are_refused_at_start_all_at_once(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path, command: str
) -> None:
    """``999999999d`` used to be accepted; the settle then failed with DatetimeFieldOverflow."""
    (tmp_path / ".env").write_text("QUEUE_BACKOFF_MAX=999999999d\nQUEUE_RETENTION_TTL=400d\n")
    (job_id,) = insert_jobs(pg, "fragile", [{"fail": "boom"}])
    done = run_cli(dsn, tmp_path, command, "--app", APP, "--lease", "999999999d")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        'brooq: config: QUEUE_LEASE: "999999999d" is longer than 8760h (365 days); write e.g. 2m',
        'brooq: config: QUEUE_BACKOFF_MAX: "999999999d" is longer than 8760h (365 days); '
        "write e.g. 1m",
        'brooq: config: QUEUE_RETENTION_TTL: "400d" is longer than 8760h (365 days); '
        "write e.g. 720h, or 0 to disable retention",
    ]
    assert done.stdout == ""
    assert row(pg, job_id)["state"] == "pending"  # nothing started
