"""The worker's sharp edges (issue 32, items 1, 2 and 16), through real supervisors.

Real ``brooq supervise`` processes (apps/worker_edges.py), real SIGSTOP and
SIGCONT, real PostgreSQL; every wait is bounded.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import Supervisor, count, insert_jobs, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = "worker_edges:queue"


def trace(directory: Path) -> list[dict[str, Any]]:
    """Every line the handlers wrote down."""
    path = directory / "trace"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def done(pg: psycopg.Connection[Any], ids: list[str]) -> bool:
    """True when every one of ``ids`` is ``done``."""
    return count(pg, "id = ANY(%s::uuid[]) AND state = 'done'", [ids]) == len(ids)


# --- item 1: a frozen supervisor ---------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_frozen_supervisor_never_lets_a_job_run_in_two_processes_at_once(
    pg: psycopg.Connection[Any], tmp_path: Path, supervise: Callable[..., Supervisor]
) -> None:
    """A runs four 20 s jobs (one swallows every interrupt) with a 3 s lease and is stopped
    (SIGSTOP) while B's reaper hands the jobs out again: A's workers stop their handlers
    themselves before the lease A last renewed can end, so B's runs never meet A's."""
    lease = ("--lease", "3s", "--poll-interval", "100ms")
    env = {"QUEUE_REAPER_PERIOD": "1s"}
    a = supervise("--workers", "4", *lease, app=APP, env=env, name="frozen")
    workers_a = set(a.wait_children(4))
    payload = {"dir": str(tmp_path), "seconds": 20}
    ids = insert_jobs(pg, "frozen.sleep", [payload] * 3) + insert_jobs(
        pg, "frozen.stubborn", [payload]
    )
    wait_until(
        lambda: {r["job_id"] for r in trace(tmp_path) if r.get("start")} == set(ids),
        20,
        "A's workers to start the four jobs",
    )
    assert {r["pid"] for r in trace(tmp_path)} <= workers_a
    b = supervise("--workers", "2", *lease, app=APP, env=env, name="idle")
    b.wait_children(2)
    a.send(signal.SIGSTOP)
    try:
        wait_until(lambda: done(pg, ids), 30, "B to run the four jobs again")
    finally:
        a.send(signal.SIGCONT)

    lines = trace(tmp_path)
    assert [r for r in lines if r.get("overlap")] == [], "a job ran in two processes at once"
    for job_id in ids:
        runs = [r for r in lines if r["job_id"] == job_id]
        first = [r for r in runs if r["pid"] in workers_a]
        second = [r for r in runs if r["pid"] not in workers_a]
        assert [r["expirations"] for r in first if r.get("start")] == [0], runs
        assert [r["expirations"] for r in second if r.get("start")] == [1], runs
        b_start = min(r["at"] for r in second if r.get("start"))
        assert all(r["at"] < b_start for r in first), runs  # A's run ended before B's began
    # Each of A's workers stopped its own handler; the stubborn one's worker left.
    wait_until(lambda: len(a.events("LeaseEnding")) >= 4, 10, "A's workers to say why")
    stubborn = ids[-1]
    a.wait_event("WorkerExited", 10, reason="lease_ending")
    assert a.events("LeaseEnding", job_id=stubborn, action="exit"), a.events("LeaseEnding")
    assert count(pg, "state = 'done' AND expirations = 1 AND attempts = 2") == 4
    assert not a.exited() and not b.exited()
