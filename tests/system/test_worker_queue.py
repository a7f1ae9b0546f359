"""Each worker's queue of jobs sent ahead, with real supervisors and real signals: a job
queued behind a long one is taken back and run elsewhere (never twice), a job queued in a
worker that dies goes back uncharged, the idle poll keeps its interval without NOTIFY, and
only failures are logged by default.

App: apps/sysapp_queue.py; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import count, insert_jobs, job, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = "sysapp_queue:queue"
FAST = ("--poll-interval", "200ms", "--lease", "30s")


def runs(trace: Path) -> list[dict[str, Any]]:
    """Every run the handlers wrote down, by start time."""
    out = [
        json.loads(line)
        for path in trace.iterdir()
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return sorted(out, key=lambda r: r["start"])


def idle_gaps(by_pid: dict[int, list[dict[str, Any]]], since: float, until: float) -> list[float]:
    """How long each worker sat idle between ``since`` and ``until`` (its longest gap each)."""
    gaps = []
    for pid_runs in by_pid.values():
        edges = [since] + [t for r in pid_runs for t in (r["start"], r["end"])] + [until]
        starts, ends = edges[0::2], edges[1::2]
        gaps += [min(s, until) - max(e, since) for e, s in zip(starts, ends, strict=False) if s > e]
    return gaps


@pytest.mark.timeout(120)
def test_a_job_queued_behind_a_long_one_is_taken_back_and_run_once(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """A fast topic, 4 workers, one job of 5 s among 200 short ones: while short jobs wait,
    no worker idles more than 100 ms, and every job runs exactly once."""
    trace = tmp_path / "trace"
    trace.mkdir()
    sup = supervise("--workers", "4", *FAST, app=APP)
    sup.wait_event("SupervisorReady", 30)
    warm = insert_jobs(pg, "fast", [{"trace": str(trace)}] * 100)  # the topic's service time
    wait_until(lambda: count(pg, "state = 'done'") == len(warm), 30, "the warm-up jobs")
    # One long job among short ones: it lands in some worker's queue with short ones behind.
    payloads = [{"trace": str(trace)}] * 20 + [{"trace": str(trace), "sleep": 5}]
    payloads += [{"trace": str(trace)}] * 180
    t0 = time.time()
    ids = insert_jobs(pg, "fast", payloads)
    long_id = ids[20]
    short = set(ids) - {long_id}
    wait_until(lambda: count(pg, "state = 'done'") == 100 + len(ids), 60, "every job done")
    everything = runs(trace)
    measured = [r for r in everything if r["id"] in set(ids)]
    starts: defaultdict[str, int] = defaultdict(int)
    for r in everything:
        starts[r["id"]] += 1
    assert all(n == 1 for n in starts.values()), "a job ran twice"
    assert set(starts) >= set(ids)
    assert count(pg, "attempts <> 1") == 0
    last_short = max(r["start"] for r in measured if r["id"] in short)
    long_run = next(r for r in measured if r["id"] == long_id)
    assert last_short < long_run["end"], "short jobs waited for the long one"
    by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in measured:
        by_pid[r["pid"]].append(r)
    # The long job's worker is busy meanwhile; the others must not idle while jobs wait.
    others = {pid: rs for pid, rs in by_pid.items() if pid != long_run["pid"]}
    gaps = idle_gaps(others, t0 + 0.5, last_short)  # after the first claim came back
    assert max(gaps, default=0.0) <= 0.1, f"a worker idled {max(gaps):.3f} s while jobs waited"
    assert job(pg, long_id)["state"] == "done"
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_a_job_queued_in_a_worker_that_dies_goes_back_uncharged(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """A worker crashes running one job while others wait in its queue: the crash is a
    recorded failure of that job only; the queued jobs run elsewhere, charged once."""
    trace = tmp_path / "trace"
    trace.mkdir()
    sup = supervise("--workers", "2", *FAST, app=APP)
    sup.wait_event("SupervisorReady", 30)
    warm = insert_jobs(pg, "fast", [{"trace": str(trace), "sleep": 0.002}] * 200)
    wait_until(lambda: count(pg, "state = 'done'") == len(warm), 30, "the warm-up jobs")
    quick = {"trace": str(trace), "sleep": 0.002}
    payloads = [quick] * 10 + [{"trace": str(trace), "sleep": 0.01, "crash": True}] + [quick] * 60
    ids = insert_jobs(pg, "fast", payloads)
    crashed = ids[10]
    wait_until(
        lambda: (
            count(pg, "state = 'done'") == len(warm) + len(ids) - 1
            and job(pg, crashed)["state"] in ("failed", "done")
        ),
        60,
        "the other jobs done and the crash recorded",
    )
    crash_row = job(pg, crashed)
    assert "exited with code 3" in (crash_row["last_error"] or ""), crash_row
    others = [i for i in ids if i != crashed]
    assert count(pg, "id = ANY(%s) AND (attempts <> 1 OR state <> 'done')", [others]) == 0
    ran: defaultdict[str, int] = defaultdict(int)
    for r in runs(trace):
        ran[r["id"]] += 1
    assert all(ran[i] == 1 for i in others), "a queued job ran twice"
    exited = sup.events("WorkerExited", reason="crash")
    assert exited, "the worker did not crash"
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_without_notify_a_job_starts_within_the_poll_interval(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """QUEUE_NOTIFY off: a job enqueued at any moment starts within the poll interval
    (200 ms) plus 50 ms."""
    trace = tmp_path / "trace"
    trace.mkdir()
    sup = supervise("--workers", "2", *FAST, app=APP, env={"QUEUE_NOTIFY": "false"})
    sup.wait_event("SupervisorReady", 30)
    delays = []
    for i in range(12):
        time.sleep(0.137 * (i % 4) + 0.05)  # at every phase of the poll
        enqueued = time.time()
        row = pg.execute(
            "INSERT INTO job (topic, payload) VALUES ('fast', %s) RETURNING id",
            (json.dumps({"trace": str(trace), "sleep": 0}),),
        ).fetchone()
        assert row is not None
        job_id = str(row[0])

        def done(job_id: str = job_id) -> bool:
            return bool(job(pg, job_id)["state"] == "done")

        wait_until(done, 5, "the job to run")
        started = next(r["start"] for r in runs(trace) if r["id"] == job_id)
        delays.append(started - enqueued)
    assert max(delays) <= 0.25, [round(d, 3) for d in delays]
    assert sup.stop() == 0


@pytest.mark.timeout(60)
def test_by_default_done_jobs_are_not_logged_and_failures_are(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--workers", "1", *FAST, app=APP)
    sup.wait_event("SupervisorReady", 30)
    (ok,) = insert_jobs(pg, "fast", [{}])
    (bad,) = insert_jobs(pg, "fail", [{}])
    wait_until(
        lambda: job(pg, ok)["state"] == "done" and job(pg, bad)["state"] == "dead", 30, "both"
    )
    sup.wait_event("JobDead", 10, job_id=bad)
    assert sup.stop() == 0
    assert not sup.events("JobDone", job_id=ok) and not sup.events("JobClaimed", job_id=ok)


@pytest.mark.timeout(60)
def test_sigterm_to_a_worker_between_jobs_puts_its_queue_back(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """A worker told to stop by SIGTERM (systemd, an operator) leaves after its job; jobs it
    had not started run in another worker, once each."""
    trace = tmp_path / "trace"
    trace.mkdir()
    sup = supervise("--workers", "2", *FAST, app=APP)
    sup.wait_event("SupervisorReady", 30)
    ids = insert_jobs(pg, "fast", [{"trace": str(trace), "sleep": 0.002}] * 400)
    wait_until(lambda: count(pg, "state = 'done'") >= 50, 30, "the drain to be under way")
    victim = sup.children()[0]
    os.kill(victim, signal.SIGTERM)
    wait_until(lambda: count(pg, "state = 'done'") == len(ids), 60, "every job done")
    ran: defaultdict[str, int] = defaultdict(int)
    for r in runs(trace):
        ran[r["id"]] += 1
    assert all(ran[i] == 1 for i in ids), "a job ran twice"
    assert count(pg, "attempts <> 1") == 0
    assert sup.stop() == 0
