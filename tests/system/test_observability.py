"""Observability of a real supervisor: /metrics summed over its children, the files behind it,
hung and lease-lost counters, the database gauges, /healthz through a database outage, the
token-guarded job endpoints, and the JSON log. Real processes, real PostgreSQL, bounded waits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq.postgres import migrations
from brooq.postgres.store import PostgresStore
from tests.system.harness import (
    Supervisor,
    all_terminal,
    count,
    insert_jobs,
    job,
    run_cli,
    states,
    wait_until,
)
from tests.system.obs_helpers import (
    Scrape,
    healthz,
    http_addr,
    private_cluster,
    request,
    request_json,
    scrape,
)

pytestmark = [pytest.mark.system, pytest.mark.db]

FAST = ("--poll-interval", "200ms", "--graceful-timeout", "3s")
QUICK_RETRY = {"QUEUE_BACKOFF_BASE": "10ms", "QUEUE_BACKOFF_MAX": "50ms"}
TOKEN = "s3cret-token-for-tests-0123456789"


def scrape_until(addr: str, ok: Any, timeout: float, what: str) -> Scrape:
    """Scrape until ``ok(scrape)`` holds; that scrape."""

    def check() -> Scrape | None:
        page = scrape(addr)
        return page if ok(page) else None

    return wait_until(check, timeout, what, interval=0.2)


def sum_attempts(pg: psycopg.Connection[Any]) -> int:
    row = pg.execute("SELECT coalesce(sum(attempts), 0) FROM job").fetchone()
    assert row is not None
    return int(row[0])


# --- counters across processes --------------------------------------------------------------


@pytest.mark.timeout(120)
def test_counters_of_four_children_add_up_exactly_in_one_scrape(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    total = 1000
    sup = supervise("--workers", "4", *FAST)
    addr = http_addr(sup)
    sup.wait_children(4)
    pg.execute(
        "INSERT INTO job (topic, payload) SELECT 'work', 'null' FROM generate_series(1, %s)",
        (total,),
    )
    pg.execute("SELECT pg_notify('brooq_job', 'work')")
    wait_until(lambda: count(pg, "state = 'done'") == total, 90, "1,000 jobs done")
    assert count(pg, "attempts <> 1") == 0
    holders = [r[0] for r in pg.execute("SELECT DISTINCT locked_by FROM job")]
    # The supervisor claims for its children: one holder, its own, unique per process start.
    (started,) = sup.events("SupervisorStarted")
    assert holders == [started["holder"]]

    def complete(page: Scrape) -> bool:
        return (
            min(
                page.value("brooq_settle_total", topic="work", outcome="done"),
                page.value("brooq_claimed_total", topic="work"),
                page.value("brooq_attempt_duration_seconds_count", topic="work"),
            )
            >= total
        )

    page = scrape_until(addr, complete, 15, "the scrape to count 1,000")
    assert page.value("brooq_settle_total", topic="work", outcome="done") == total
    assert page.value("brooq_settle_total") == total  # no other outcome
    assert page.value("brooq_claimed_total", topic="work") == total
    assert page.value("brooq_attempt_duration_seconds_count", topic="work") == total
    assert page.value("brooq_attempt_duration_seconds_bucket", topic="work", le="+Inf") == total
    assert page.value("brooq_attempt_duration_seconds_sum", topic="work") > 0
    assert page.value("brooq_workers") == 4
    assert page.value("brooq_worker_busy") == 0
    assert page.value("brooq_jobs", topic="work", state="done") == total
    assert page.seconds < 1.0
    assert sup.stop() == 0


@pytest.mark.timeout(120)
def test_a_killed_child_s_counts_survive_its_death(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """kill -9 of a child inside a handler, after it ran many jobs: every count stays exact.

    (The child is killed in its handler, not at a random point: a kill between a
    settle's commit and the counter's increment loses that one count, by design.)
    """
    half = 200
    sup = supervise("--workers", "2", *FAST, env=QUICK_RETRY)
    addr = http_addr(sup)
    sup.wait_children(2)
    insert_jobs(pg, "work", [None] * half)
    wait_until(lambda: count(pg, "state = 'done'") == half, 60, "the first half done")
    (slow,) = insert_jobs(pg, "work", [{"sleep_first": 60}])
    victim = wait_until(lambda: sup.child_running(slow), 15, "the slow job running")
    scrape_until(addr, lambda p: p.value("brooq_worker_busy") == 1, 10, "busy = 1")
    os.kill(victim, signal.SIGKILL)
    assert sup.wait_event("WorkerExited", 10, pid=victim)["reason"] == "crash"
    insert_jobs(pg, "work", [None] * half)
    total = 2 * half + 1
    wait_until(lambda: count(pg, "state = 'done'") == total, 60, "every job done")
    assert job(pg, slow)["attempts"] == 2  # the killed attempt was a recorded failure

    page = scrape_until(
        addr,
        lambda p: p.value("brooq_attempt_duration_seconds_count", topic="work") >= total,
        15,
        "the scrape to count every job",
    )
    assert page.value("brooq_settle_total", topic="work", outcome="done") == total
    assert page.value("brooq_settle_total", topic="work", outcome="failed") == 1
    assert page.value("brooq_claimed_total", topic="work") == total + 1 == sum_attempts(pg)
    assert page.value("brooq_attempt_duration_seconds_count", topic="work") == total
    assert page.value("brooq_worker_restarts_total", reason="crash") == 1
    assert page.value("brooq_worker_busy") == 0  # the dead child's busy gauge is gone
    assert sup.stop() == 0


@pytest.mark.timeout(150)
def test_metrics_files_stay_bounded_across_many_child_restarts(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """Each child recycles after one job: ~300 children, yet only a few files per slot."""
    total, workers = 300, 2
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    sup = supervise(
        "--workers", str(workers), "--max-jobs-per-worker", "1", *FAST, env={"TMPDIR": str(tmpdir)}
    )
    addr = http_addr(sup)
    (directory,) = wait_until(lambda: list(tmpdir.glob("brooq-metrics-*")), 10, "metrics dir")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    insert_jobs(pg, "work", [None] * total)
    wait_until(lambda: count(pg, "state = 'done'") == total, 120, "300 jobs done")
    page = scrape_until(
        addr,
        lambda p: (
            p.value("brooq_worker_restarts_total", reason="max_jobs") >= total
            and p.value("brooq_settle_total", outcome="done") >= total
        ),
        20,
        "every recycle counted",
    )
    assert page.value("brooq_settle_total", topic="work", outcome="done") == total
    assert page.value("brooq_claimed_total") == total
    assert page.seconds < 1.0  # a sanity bound, not a benchmark

    files = sorted(p.name for p in directory.iterdir() if p.suffix == ".db")
    owners = {re.sub(r"^.*_(\w+)\.db$", r"\1", name) for name in files}
    assert owners <= {"supervisor"} | {f"w{k}" for k in range(2 * workers)}, files
    assert len(files) <= 6 * workers + 4, files
    assert sup.stop() == 0
    assert not directory.exists()


# --- hung handlers and lost leases ------------------------------------------------------------


@pytest.mark.timeout(90)
def test_hung_handlers_move_the_hung_counter(pg: psycopg.Connection[Any], supervise: Any) -> None:
    """One handler ignores its attempt timeout, one ignores a cancel: both are SIGKILLed."""
    sup = supervise("--workers", "2", "--watchdog-grace", "1s", *FAST)
    addr = http_addr(sup)
    sup.wait_children(2)
    (timed_out,) = insert_jobs(pg, "hung", [{"hang": True}])
    (canceled,) = insert_jobs(pg, "work", [{"hang": True}])
    wait_until(lambda: sup.child_running(canceled), 15, "the second job running")
    store = PostgresStore(sup.dsn)
    try:
        assert store.cancel(canceled, "test")
    finally:
        store.close()
    # The counter moves at the kill; the restart and the recorded failure when it is reaped.
    page = scrape_until(
        addr,
        lambda p: (
            p.value("brooq_hung_workers_total", topic="hung") >= 1
            and p.value("brooq_hung_workers_total", topic="work") >= 1
            and p.value("brooq_worker_restarts_total", reason="hung") >= 2
            and p.value("brooq_settle_total", topic="hung") >= 1
        ),
        20,
        "both hung workers killed and reaped",
    )
    assert page.value("brooq_hung_workers_total") == 2
    assert page.value("brooq_worker_restarts_total", reason="hung") == 2
    assert page.value("brooq_settle_total", topic="hung", outcome="failed") == 1
    reasons = {e["job_id"]: e["reason"] for e in sup.events("WorkerKilled")}
    assert reasons == {timed_out: "hung:attempt_timeout", canceled: "hung:canceled"}
    assert job(pg, canceled)["state"] == "canceled"
    assert job(pg, timed_out)["state"] == "failed"
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_a_lost_lease_moves_the_lease_lost_counter(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """Someone else takes the row while it runs: the next heartbeat finds the lease lost."""
    sup = supervise("--workers", "1", "--lease", "3s", "--watchdog-grace", "2s", *FAST)
    addr = http_addr(sup)
    sup.wait_children(1)
    (job_id,) = insert_jobs(pg, "work", [{"loop": 30}])
    wait_until(lambda: sup.child_running(job_id), 15, "the job running")
    pg.execute("UPDATE job SET locked_by = 'someone-else' WHERE id = %s", (job_id,))
    page = scrape_until(
        addr,
        lambda p: p.value("brooq_lease_lost_total", topic="work") >= 1,
        15,
        "the lease-lost counter",
    )
    assert page.value("brooq_lease_lost_total", topic="work") == 1
    sup.wait_event("LeaseLost", 10, job_id=job_id)
    # The handler honours the interrupt within its grace: nobody is killed.
    assert page.value("brooq_hung_workers_total") == 0
    pg.execute("UPDATE job SET state = 'canceled' WHERE id = %s", (job_id,))
    assert sup.stop() == 0
    assert sup.events("WorkerKilled") == []


# --- database gauges --------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_depth_and_oldest_ready_age_come_from_the_database(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    pg.execute(
        "INSERT INTO job (topic, payload, available_at) "
        "VALUES ('poison', 'null', now() - interval '10 seconds')"
    )  # nobody serves it
    pg.execute(
        "INSERT INTO job (topic, payload, available_at) "
        "VALUES ('work', 'null', now() + interval '1 hour')"
    )  # pending, not ready
    insert_jobs(pg, "work", [None] * 5)
    sup = supervise("--workers", "1", "--topics", "work", *FAST)
    addr = http_addr(sup)
    wait_until(lambda: count(pg, "state = 'done'") == 5, 30, "5 jobs done")
    page = scrape(addr)
    assert page.value("brooq_jobs", topic="work", state="done") == 5
    assert page.value("brooq_jobs", topic="work", state="pending") == 1
    assert page.value("brooq_jobs", topic="poison", state="pending") == 1
    assert page.value("brooq_jobs") == 7
    assert page.value("brooq_ready_oldest_age_seconds", topic="work") == 0  # none ready
    assert page.value("brooq_ready_oldest_age_seconds", topic="hung") == 0  # no jobs at all
    assert 10 <= page.value("brooq_ready_oldest_age_seconds", topic="poison") < 60
    assert {s.labels["topic"] for s in page.matching("brooq_ready_oldest_age_seconds")} == {
        "work",
        "poison",
        "hung",
    }
    assert sup.stop() == 0


# --- /healthz ----------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_healthz_follows_a_database_outage(tmp_path: Path) -> None:
    """A private cluster (the shared test server must stay up) is stopped and started again."""
    with private_cluster() as cluster:
        url = cluster.url()
        migrations.up(url)
        sup = Supervisor(url, tmp_path, args=["--workers", "2", *FAST], name="outage")
        sup.start()
        try:
            addr = http_addr(sup)
            sup.wait_children(2)
            wait_until(lambda: healthz(addr)[0] == 200, 15, "/healthz 200")
            cluster.run("stop")
            _, reason = wait_until(
                lambda: (h := healthz(addr))[0] == 503 and h,
                20,
                "/healthz 503 while PostgreSQL is down",
            )
            assert reason == "database unavailable"  # the details go to the log only
            assert scrape(addr).value("brooq_workers") == 2  # /metrics still answers
            cluster.run("up")
            wait_until(lambda: healthz(addr)[0] == 200, 30, "/healthz 200 after PostgreSQL returns")
            # The supervisor reconnected for real: a job enqueued now gets done.
            with psycopg.connect(url, autocommit=True) as conn:
                (job_id,) = insert_jobs(conn, "work", [None])
                wait_until(lambda: job(conn, job_id)["state"] == "done", 40, "a job after outage")
            assert sup.stop() == 0
        finally:
            sup.stop(timeout=10)


# --- token-guarded job endpoints -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_job_endpoints_need_the_bearer_token(pg: psycopg.Connection[Any], supervise: Any) -> None:
    (job_id,) = insert_jobs(pg, "poison", [{"n": 1}])  # nobody serves poison: it stays pending
    guarded = supervise("--workers", "1", "--topics", "work", *FAST, env={"BROOQ_TOKEN": TOKEN})
    base = f"http://{http_addr(guarded)}/jobs/{job_id}"
    for token in (None, "wrong", ""):
        assert request(base, token=token)[0] == 401
        assert request(f"{base}/cancel", "POST", token=token)[0] == 401
    status, row = request_json(base, token=TOKEN)
    assert status == 200
    assert row["id"] == job_id and row["state"] == "pending" and row["payload"] == {"n": 1}
    assert (
        request(
            f"http://{http_addr(guarded)}/jobs/00000000-0000-0000-0000-000000000000", token=TOKEN
        )[0]
        == 404
    )
    assert job(pg, job_id)["state"] == "pending"  # refused calls changed nothing
    status, body = request_json(f"{base}/cancel", "POST", token=TOKEN)
    assert status == 200 and body["canceled"] is True and body["state"] == "canceled"
    status, body = request_json(f"{base}/cancel", "POST", token=TOKEN)
    assert status == 200 and body["canceled"] is False
    assert job(pg, job_id)["state"] == "canceled"

    open_surface = supervise("--workers", "1", "--topics", "work", *FAST, name="no-token")
    base = f"http://{http_addr(open_surface)}/jobs/{job_id}"
    for method, url in (("GET", base), ("POST", f"{base}/cancel")):
        status, body = request_json(url, method, token=TOKEN)
        assert status == 404 and "disabled" in body["error"]
    assert guarded.stop() == 0 and open_surface.stop() == 0


@pytest.mark.timeout(60)
def test_a_non_loopback_address_needs_the_explicit_flag(dsn: str, tmp_path: Path) -> None:
    done = run_cli(dsn, tmp_path, "supervise", "--app", "sysapp:queue", "--http-addr", "0.0.0.0:0")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("brooq: error:")]
    assert len(lines) == 1 and "not loopback" in lines[0] and "--http-allow-remote" in lines[0]
    assert "WorkerStarted" not in done.stderr
    done = run_cli(
        dsn,
        tmp_path,
        "supervise",
        "--app",
        "sysapp:queue",
        "--http-addr",
        "0.0.0.0:0",
        "--http-allow-remote",
    )
    assert done.returncode == 2 and "BROOQ_TOKEN" in done.stderr


# --- logs ----------------------------------------------------------------------------------------


class FlagLogSupervisor(Supervisor):
    """A supervisor whose JSON logs come from the ``--log-format json`` flag, not LOG_FORMAT."""

    def command(self) -> list[str]:
        cmd = super().command()
        return [*cmd[:3], "--log-format", "json", *cmd[3:]]

    def env(self) -> dict[str, str]:
        env = super().env()
        env.pop("LOG_FORMAT", None)
        return env


@pytest.mark.timeout(90)
def test_json_log_lines_name_their_events(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    sup = FlagLogSupervisor(
        dsn,
        tmp_path,
        args=["--workers", "2", *FAST],
        env={**QUICK_RETRY, "QUEUE_LOG_JOBS": "true"},
        name="logs",
    )
    sup.start()
    try:
        sup.wait_children(2)
        (ok,) = insert_jobs(pg, "work", [None])
        (poison,) = insert_jobs(pg, "poison", [{"crash": "exit1"}])
        (hung,) = insert_jobs(pg, "hung", [{"hang": True}])
        wait_until(
            lambda: job(pg, poison)["state"] == "dead" and job(pg, hung)["state"] == "failed",
            40,
            "poison dead, hung failed",
        )
        assert job(pg, ok)["state"] == "done"
        sup.wait_children(2)
        assert sup.stop() == 0
    finally:
        sup.stop(timeout=10)

    lines = [line for line in sup.log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is JSON
    assert all(isinstance(r, dict) and r.get("event") for r in records)

    def named(name: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            r
            for r in records
            if r["event"] == name and all(r.get(k) == v for k, v in fields.items())
        ]

    assert named("JobClaimed", job_id=ok) and named("JobDone", job_id=ok, topic="work")
    assert len(named("JobClaimed", job_id=poison)) == 3
    assert [r["attempt"] for r in named("JobFailed", job_id=poison)] == [1, 2]
    assert [r["attempt"] for r in named("JobDead", job_id=poison)] == [3]
    assert named("JobFailed", job_id=hung, topic="hung")
    (killed,) = named("WorkerKilled")
    assert killed["job_id"] == hung and killed["reason"] == "hung:attempt_timeout"
    exits = [r["reason"] for r in named("WorkerExited")]
    assert exits.count("crash") == 3 and exits.count("hung") == 1
    assert len(named("WorkerStarted")) == 2 + 3 + 1  # first two, then one per replacement
    assert {"SupervisorStarted", "SupervisorStopping", "SupervisorExited"} <= {
        r["event"] for r in records
    }
    assert states(pg) == {"done": 1, "dead": 1, "failed": 1}
    assert all_terminal(pg) is False  # the hung job waits for its retry
