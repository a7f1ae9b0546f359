"""The pre-fork supervisor as a real process: real children, real signals, real PostgreSQL.

Each test starts ``python -m brooq.cli supervise`` (see harness.py), steers
handlers through payloads (apps/sysapp.py), and checks the rows, the
processes in /proc and the JSON log. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import (
    alive,
    all_terminal,
    count,
    insert_jobs,
    job,
    rss_bytes,
    run_cli,
    states,
    title,
    wait_until,
)

pytestmark = [pytest.mark.system, pytest.mark.db]

FAST = ("--poll-interval", "200ms", "--graceful-timeout", "3s")
MIB = 1024 * 1024


def create_handled(pg: psycopg.Connection[Any]) -> None:
    """The side-effect table handlers write in their settle transaction (``record``)."""
    pg.execute("CREATE TABLE handled (job_id uuid NOT NULL UNIQUE)")


def handled_ids(pg: psycopg.Connection[Any]) -> list[str]:
    return [str(r[0]) for r in pg.execute("SELECT job_id FROM handled")]


@pytest.mark.timeout(120)
def test_four_workers_drain_5000_jobs_each_once(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """5,000 jobs, 4 processes: each job done once, attempts = 1, one settle-tx row each."""
    create_handled(pg)
    total = 5000
    pg.execute(
        "INSERT INTO job (topic, payload) "
        "SELECT 'work', '{\"record\": true}'::jsonb FROM generate_series(1, %s)",
        (total,),
    )
    sup = supervise("--workers", "4", *FAST)
    sup.wait_children(4)
    wait_until(lambda: count(pg, "state = 'done'") == total, 90, "5,000 jobs done")
    assert states(pg) == {"done": total}
    assert count(pg, "attempts <> 1") == 0
    assert count(pg, "last_error IS NOT NULL") == 0
    rows = handled_ids(pg)
    assert len(rows) == total and len(set(rows)) == total
    assert count(pg, "id NOT IN (SELECT job_id FROM handled)") == 0
    assert len(sup.children()) == 4
    assert sup.events("WorkerExited") == []
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_kill_9_of_a_child_mid_job_is_a_recorded_failure_and_the_slot_restarts(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--workers", "4", *FAST)
    first = sup.wait_children(4)
    (victim,) = insert_jobs(pg, "work", [{"sleep_first": 3}])
    wait_until(lambda: job(pg, victim)["state"] == "processing", 10, "the job to be claimed")
    pid = wait_until(lambda: sup.child_running(victim), 5, "a child titled with the job id")
    assert pid in first and f"job {victim} attempt 1" in title(pid)
    others = insert_jobs(pg, "work", [{"sleep": 0.2}] * 12)
    os.kill(pid, signal.SIGKILL)

    failed = wait_until(
        lambda: (r := job(pg, victim))["state"] == "failed" and r,
        5,
        "the killed attempt to be recorded failed",
    )
    assert failed["attempts"] == 1
    assert "SIGKILL" in failed["last_error"]
    replaced = sup.wait_children(4, exclude=[pid])
    assert len(set(replaced) - set(first)) == 1

    wait_until(lambda: all_terminal(pg), 20, "every job to finish")
    final = job(pg, victim)
    assert final["state"] == "done" and final["attempts"] == 2
    assert "killed by SIGKILL" in final["last_error"]
    assert count(pg, "id = ANY(%s) AND (state <> 'done' OR attempts <> 1)", [others]) == 0
    exited = sup.events("WorkerExited", pid=pid)
    assert [e["reason"] for e in exited] == ["crash"]
    assert sup.events("JobFailed", job_id=victim, attempt=1)
    assert sup.stop() == 0


@pytest.mark.timeout(60)
def test_poison_job_that_exits_the_process_goes_dead_after_max_attempts(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--workers", "2", *FAST)
    sup.wait_children(2)
    (poison,) = insert_jobs(pg, "poison", [{"crash": "exit1"}])
    healthy = insert_jobs(pg, "work", [None] * 10)
    wait_until(lambda: job(pg, poison)["state"] == "dead", 30, "the poison job to go dead")
    row = job(pg, poison)
    assert row["attempts"] == 3
    assert "exited with code 1" in row["last_error"]
    wait_until(lambda: all_terminal(pg), 10, "the other jobs")
    assert count(pg, "id = ANY(%s) AND state = 'done' AND attempts = 1", [healthy]) == 10
    crashes = [e for e in sup.events("WorkerExited") if e["reason"] == "crash"]
    assert len(crashes) == 3 and all(e["exit"] == "exited with code 1" for e in crashes)
    assert len(sup.events("JobDead", job_id=poison)) == 1
    sup.wait_children(2)
    assert sup.stop() == 0


@pytest.mark.timeout(60)
def test_handler_ignoring_every_interrupt_is_killed_after_the_grace(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """attempt_timeout 1s + watchdog_grace 1s: SIGKILL about 2 s after the claim."""
    sup = supervise("--workers", "2", *FAST)
    sup.wait_children(2)
    (hung,) = insert_jobs(pg, "hung", [{"hang": True}])
    wait_until(lambda: job(pg, hung)["state"] == "processing", 10, "the hung job to be claimed")
    pid = wait_until(lambda: sup.child_running(hung), 5, "the child running it")
    claimed_at = time.monotonic()

    killed = sup.wait_event("WorkerKilled", 10, pid=pid)
    waited = time.monotonic() - claimed_at
    assert killed["reason"] == "hung:attempt_timeout"
    assert killed["job_id"] == hung
    assert 1.0 <= waited <= 5.0, waited
    wait_until(lambda: not alive(pid), 5, "the hung child to be gone")
    row = wait_until(
        lambda: (r := job(pg, hung))["state"] != "processing" and r, 5, "the failure to be recorded"
    )
    assert row["state"] == "failed" and row["attempts"] == 1
    assert "timed out" in row["last_error"] and "killed" in row["last_error"]
    assert "SIGKILL" in row["last_error"]
    sup.wait_children(2, exclude=[pid])
    assert [e["reason"] for e in sup.events("WorkerExited", pid=pid)] == ["hung"]
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_kill_9_of_the_supervisor_then_a_new_one_finishes_every_job_uncharged(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """Children die with their parent; the lease expires; the reaper charges no attempt."""
    args = ("--workers", "4", "--lease", "3s", *FAST)
    first = supervise(*args, name="first")
    first.wait_children(4)
    ids = insert_jobs(pg, "work", [{"sleep": 2}] * 8)
    wait_until(lambda: count(pg, "state = 'processing'") == 4, 10, "4 jobs in flight")
    pids = first.children()
    assert len(pids) == 4
    first.send(signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: not any(alive(p) for p in pids), 2.0, "every child to die with the parent")
    assert time.monotonic() - killed_at <= 2.0
    assert first.wait_exit(5) == -signal.SIGKILL
    in_flight = [str(r[0]) for r in pg.execute("SELECT id FROM job WHERE state = 'processing'")]
    assert len(in_flight) == 4

    second = supervise(*args, name="second")
    wait_until(lambda: count(pg, "state = 'done'") == 8, 40, "every job done after the lease")
    assert states(pg) == {"done": 8}
    for job_id in ids:
        row = job(pg, job_id)
        assert row["last_error"] is None, row
        assert row["attempts"] == (2 if job_id in in_flight else 1), row
    # Taken twice, charged once: the expiry is counted apart (invariant 7).
    assert count(pg, "id = ANY(%s) AND expirations = 1", [in_flight]) == 4
    assert count(pg, "expirations <> 0 AND NOT id = ANY(%s)", [in_flight]) == 0
    assert sum(e["count"] for e in second.events("JobRequeued")) == 4
    assert second.events("JobFailed") == []
    assert second.stop() == 0


@pytest.mark.timeout(60)
def test_cancel_of_a_running_job_interrupts_the_handler_through_notify(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path, dsn: str
) -> None:
    create_handled(pg)
    # A long lease: a heartbeat (every lease/3) cannot be what interrupts the handler.
    sup = supervise("--workers", "2", "--lease", "60s", *FAST)
    sup.wait_children(2)
    mark = tmp_path / "interrupted"
    (target,) = insert_jobs(pg, "work", [{"loop": 30, "record": True, "mark": str(mark)}])
    pid = wait_until(lambda: sup.child_running(target), 10, "the child running the job")
    time.sleep(0.3)  # the handler is in its loop of short sleeps

    done = run_cli(dsn, tmp_path, "cancel", target)
    canceled_at = time.time()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"canceled {target}"
    wait_until(mark.exists, 2.0, "the handler to be interrupted")
    wait_until(lambda: mark.read_text().count(" ") == 1, 1.0, "the mark to be written")
    reason, at = mark.read_text().split()
    assert reason == "JobCanceledWhileRunning"  # SIGUSR2 after NOTIFY, not a lost lease
    assert float(at) - canceled_at < 1.5
    notice = sup.wait_event("JobCanceled", 5, job_id=target, logger="brooq.supervisor")
    assert notice["pid"] == pid
    wait_until(lambda: "idle" in title(pid), 5, "the child to go idle")

    time.sleep(0.5)
    row = job(pg, target)
    assert row["state"] == "canceled" and row["attempts"] == 1
    assert handled_ids(pg) == []
    assert sup.events("WorkerKilled") == []
    assert pid in sup.children()
    assert sup.stop() == 0


@pytest.mark.timeout(60)
def test_sigterm_lets_a_short_job_finish_and_exits_0(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--workers", "2", "--poll-interval", "200ms", "--graceful-timeout", "10s")
    sup.wait_children(2)
    (short,) = insert_jobs(pg, "work", [{"sleep": 2}])
    wait_until(lambda: job(pg, short)["state"] == "processing", 10, "the job to be claimed")
    sup.send(signal.SIGTERM)
    assert sup.wait_exit(15) == 0
    row = job(pg, short)
    assert row["state"] == "done" and row["attempts"] == 1
    assert count(pg, "state = 'processing'") == 0
    assert sup.events("WorkerKilled") == []
    assert all(e["reason"] == "stopped" for e in sup.events("WorkerExited"))


@pytest.mark.timeout(60)
def test_sigterm_past_the_graceful_timeout_returns_the_job_uncharged(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--workers", "2", "--poll-interval", "200ms", "--graceful-timeout", "1s")
    sup.wait_children(2)
    (long_job,) = insert_jobs(pg, "work", [{"sleep": 30}])
    wait_until(lambda: job(pg, long_job)["state"] == "processing", 10, "the job to be claimed")
    pids = sup.children()
    sup.send(signal.SIGTERM)
    assert sup.wait_exit(10) == 0
    assert not any(alive(p) for p in pids)
    row = job(pg, long_job)
    assert row["state"] == "pending" and row["attempts"] == 0
    assert row["locked_by"] is None and row["last_error"] is None
    assert count(pg, "state = 'processing'") == 0
    assert [e["reason"] for e in sup.events("WorkerKilled")] == ["shutdown"]
    assert sup.events("JobReleased", job_id=long_job)


@pytest.mark.timeout(90)
def test_a_leaking_worker_is_recycled_above_max_memory(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """50 MiB leaked per job, limit 150 MiB: replaced between jobs, no job lost or charged twice.

    A short lease bounds the test: a job claimed by a worker that then leaves
    without running it comes back only through the reaper, with attempts = 2.
    """
    limit, leak = 150 * MIB, 50 * MIB
    sup = supervise("--workers", "2", "--max-memory-per-worker", "150MiB", "--lease", "4s", *FAST)
    sup.wait_children(2)
    ids = insert_jobs(pg, "work", [{"leak_mib": 50, "sleep": 0.2}] * 12)
    peak = 0
    deadline = time.monotonic() + 40
    while not all_terminal(pg) and time.monotonic() < deadline:
        peak = max([peak] + [rss_bytes(p) for p in sup.children()])
        time.sleep(0.02)
    assert all_terminal(pg), f"the jobs did not finish in 40 s: {states(pg)}"
    twice = [
        r
        for r in pg.execute(
            "SELECT id::text, state, attempts, locked_by FROM job WHERE attempts <> 1"
        )
    ]
    assert twice == [], "jobs claimed by a worker that left to be recycled without running them"
    assert count(pg, "id = ANY(%s) AND state = 'done'", [ids]) == 12
    recycled = [e for e in sup.events("WorkerExited") if e["reason"] == "max_memory"]
    assert len(recycled) >= 2
    assert all(e["exit"] == "exited with code 4" for e in recycled)
    assert limit < peak <= limit + 2 * leak, f"peak RSS {peak / MIB:.0f} MiB"
    assert sup.stop() == 0


@pytest.mark.timeout(60)
def test_workers_are_recycled_after_max_jobs(pg: psycopg.Connection[Any], supervise: Any) -> None:
    sup = supervise("--workers", "2", "--max-jobs-per-worker", "5", *FAST)
    sup.wait_children(2)
    ids = insert_jobs(pg, "work", [None] * 40)
    wait_until(lambda: all_terminal(pg), 40, "40 jobs")
    assert count(pg, "id = ANY(%s) AND state = 'done' AND attempts = 1", [ids]) == 40
    recycled = [e for e in sup.events("WorkerExited") if e["reason"] == "max_jobs"]
    # Two children remain with at most 4 jobs each: 32+ jobs ran in children of exactly 5.
    assert len(recycled) >= 7
    assert {e["reason"] for e in sup.events("WorkerExited")} == {"max_jobs"}
    sup.wait_children(2)
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_ttin_ttou_change_the_count_and_hup_replaces_every_child(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--workers", "2", *FAST)
    two = sup.wait_children(2)
    sup.send(signal.SIGTTIN)
    three = sup.wait_children(3)
    assert set(two) < set(three)
    sup.send(signal.SIGTTIN)
    four = sup.wait_children(4)
    sup.send(signal.SIGTTOU)
    back = sup.wait_children(3)
    assert set(back) < set(four)
    assert [e["workers"] for e in sup.events("WorkersChanged")] == [3, 4, 3]

    ids = insert_jobs(pg, "work", [{"sleep": 0.05}] * 200)
    wait_until(lambda: count(pg, "state = 'done'") >= 20, 20, "the first 20 jobs")
    old = sup.children()
    assert count(pg, "state = 'pending'") > 50  # the reload happens while jobs run
    sup.send(signal.SIGHUP)
    new = wait_until(
        lambda: (p := sup.children()) and len(p) == 3 and not set(p) & set(old) and p,
        20,
        "every child to be replaced",
    )
    assert len(new) == 3
    wait_until(lambda: all_terminal(pg), 30, "200 jobs")
    assert count(pg, "id = ANY(%s) AND state = 'done' AND attempts = 1", [ids]) == 200
    reasons = [e["reason"] for e in sup.events("WorkerExited")]
    assert reasons.count("reload") == 3 and reasons.count("stopped") == 1, reasons
    assert sup.events("WorkerKilled") == []
    assert sup.stop() == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("app", ["sysapp_broken:queue", "sysapp_missing:queue"])
def test_an_app_that_fails_to_import_exits_2_with_one_clear_line(
    dsn: str, tmp_path: Path, app: str
) -> None:
    done = run_cli(dsn, tmp_path, "supervise", "--app", app, "--workers", "2")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("brooq: error: --app")
    module = app.split(":")[0]
    assert module in lines[0]
    if module == "sysapp_broken":
        assert "RuntimeError: sysapp_broken refuses to import" in lines[0]
    else:
        assert "no module named" in lines[0]
    assert done.stdout == ""


@pytest.mark.timeout(60)
def test_weighted_workers_serve_their_topics(pg: psycopg.Connection[Any], supervise: Any) -> None:
    sup = supervise("--workers", "t.a=2,t.b=1", *FAST, app="sysapp_weighted:queue")
    pids = sup.wait_children(3)
    # A child can be seen before its WorkerStarted line is read from the log.
    started = wait_until(
        lambda: (
            (s := {e["pid"]: e["topics"] for e in sup.events("WorkerStarted")}).keys() >= set(pids)
            and s
        ),
        10,
        "WorkerStarted of every child",
    )
    assert sorted(started[p] for p in pids) == ["t.a", "t.a", "t.b"]
    a_ids = insert_jobs(pg, "t.a", [{"sleep": 1.5}] * 3)
    b_ids = insert_jobs(pg, "t.b", [{"sleep": 1.5}] * 2)

    def busy() -> dict[int, str] | None:
        titles = sup.titles()
        return titles if sum("job" in t for t in titles.values()) == 3 else None

    titles = wait_until(busy, 10, "three busy children")
    for pid, text in titles.items():
        assert f": {started[pid]} job " in text, titles
    wait_until(lambda: all_terminal(pg), 20, "both topics")
    assert count(pg, "id = ANY(%s) AND state = 'done'", [a_ids + b_ids]) == 5
    assert sup.stop() == 0
