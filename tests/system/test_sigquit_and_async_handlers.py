"""SIGQUIT (stop now) and ``async def`` handlers, with real processes and signals."""

from __future__ import annotations

import signal
import time
from typing import Any

import psycopg
import pytest

from tests.system.harness import alive, count, insert_jobs, job, wait_until


@pytest.mark.timeout(60)
def test_sigquit_stops_at_once_and_returns_running_jobs_uncharged(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--workers", "2", "--poll-interval", "200ms", "--graceful-timeout", "30s")
    sup.wait_children(2)
    running = insert_jobs(pg, "work", [{"sleep": 30}, {"sleep": 30}])
    wait_until(lambda: count(pg, "state = 'processing'") == 2, 10, "both jobs claimed")
    pids = sup.children()
    started = time.monotonic()
    sup.send(signal.SIGQUIT)
    assert sup.wait_exit(10) == 0
    assert time.monotonic() - started < 5, "SIGQUIT must not wait for the graceful timeout"
    assert not any(alive(p) for p in pids)
    for job_id in running:
        row = job(pg, job_id)
        assert row["state"] == "pending" and row["attempts"] == 0 and row["last_error"] is None
    assert count(pg, "state = 'processing'") == 0


@pytest.mark.timeout(60)
def test_async_handlers_run_in_the_children(pg: psycopg.Connection[Any], supervise: Any) -> None:
    pg.execute("CREATE TABLE handled (job_id uuid PRIMARY KEY)")
    sup = supervise("--workers", "2", "--poll-interval", "200ms", app="sysapp_async:queue")
    sup.wait_children(2)
    done = insert_jobs(pg, "aio.ok", [{}] * 20)
    (slow,) = insert_jobs(pg, "aio.slow", [{}])
    wait_until(lambda: count(pg, "state IN ('pending', 'processing')") == 0, 30, "all settled")
    assert count(pg, "state = 'done'") == 20
    assert pg.execute("SELECT count(*) FROM handled").fetchone() == (20,)
    row = job(pg, slow)
    assert row["state"] == "dead" and "AttemptTimedOut" in row["last_error"], row
    assert all(job(pg, j)["attempts"] == 1 for j in done)
