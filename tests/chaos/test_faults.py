"""Faults over thousands of jobs through real ``brooq supervise`` processes.

Each test enqueues CHAOS_SIZE ledger jobs (2,000 in CI, 20,000 with ``make
chaos``), runs 4+ workers, injects one kind of fault for the duration, waits
until every job is terminal, then checks every job with the ledger checker:
nothing lost, no row left processing, exactly one in-database effect per
``done`` job, attempts explained. The measured numbers go to CHAOS_RESULTS
for docs/reliability.md.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from brooq.postgres import migrations
from tests.chaos.checker import create_tables, enqueue_mix, read_side_log, unfinished
from tests.chaos.rig import (
    JOBS,
    LEASE_S,
    REAPER_S,
    TEST_TIMEOUT_S,
    WORKERS,
    HealthPoller,
    Run,
    crash_exits,
    http_port,
    wait_drained,
    wait_progress,
    worker_pids,
)
from tests.system.harness import free_port

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.system,
    pytest.mark.db,
    pytest.mark.timeout(TEST_TIMEOUT_S),
]

ROOT = Path(__file__).resolve().parents[2]
PG_SH = ROOT / "scripts" / "pg.sh"
BACKGROUND_MIX = {"raise": 0.02, "poison": 0.01}
HANDLER_MIX = {"raise": 0.03, "hang": 0.01, "selfkill": 0.02, "poison": 0.01}
CRASH_SLACK = 2
OUTAGE_S = 2.0
LONG_OUTAGE_S = LEASE_S + 1.5  # every lease runs out while the database is down

Chaos = Callable[[str, str, str], Run]


def assert_clean(run: Run, verdict: Any) -> None:
    assert not verdict.problems, f"{run.name}: {verdict.report()}"
    assert verdict.lost == 0 and verdict.duplicated_effects == 0


def assert_serving(*sups: Any) -> None:
    """The supervisors outlived the faults with every slot filled, and stop cleanly."""
    for sup in sups:
        assert not sup.exited(), f"supervisor {sup.pid} died:\n{sup.log_tail()}"
        sup.wait_children(WORKERS, timeout=20)
        assert sup.events("WorkerBootFailed") == [], "a child failed to boot (crash loop?)"


def requeued(pg: psycopg.Connection[Any] | Reconnecting, *sups: Any) -> int:
    """Leases that ran out (each cost one attempt), as the rows count them (``expirations``).

    The supervisors' JobRequeued lines would under-count: a reaper whose answer
    was lost with its connection returned rows without logging them.
    """
    row = pg.execute("SELECT coalesce(sum(expirations), 0) FROM job").fetchone()
    assert row is not None
    logged = sum(int(e.get("count", 0)) for sup in sups for e in sup.events("JobRequeued"))
    assert logged <= row[0], f"the logs count {logged} requeued rows, the table {row[0]}"
    return int(row[0])


def killed(sup: Any) -> int:
    """Workers the supervisor SIGKILLed (a hung handler, a settle that outlived its timeout):
    each a recorded failure, so an attempt."""
    return len(sup.events("WorkerKilled"))


def assert_attempts_explained(verdict: Any, faults: int, what: str) -> None:
    """Every extra attempt is one a fault explains: a killed attempt or a returned lease."""
    assert verdict.extra_attempts <= faults, (
        f"{verdict.extra_attempts} extra attempts, but {what} explain at most {faults}"
    )


def held_rows(pg: psycopg.Connection[Any], pids: list[int]) -> dict[str, Any]:
    """The rows the supervisors ``pids`` held (right after they died), and the database time.

    A supervisor claims for its workers: its holder is ``host:<its pid>:<random>``.
    """
    row = pg.execute(
        "SELECT coalesce(array_agg(id), '{}'), now() FROM job WHERE state = 'processing' "
        "AND split_part(locked_by, ':', 2) = ANY(%s)",
        ([str(p) for p in pids],),
    ).fetchone()
    assert row is not None
    return {"ids": list(row[0]), "at": row[1]}


def requeue_s(killed_wall: float, sup: Any) -> float | None:
    """Seconds from the kill to the first reaper pass of ``sup`` that returned rows."""
    times = [float(e["ts"]) for e in sup.events("JobRequeued") if float(e["ts"]) >= killed_wall]
    return round(min(times) - killed_wall, 1) if times else None


def recovery_s(pg: psycopg.Connection[Any], held: dict[str, Any]) -> float | None:
    """Seconds from the kill until the last row the dead processes held was finished."""
    if not held["ids"]:
        return None
    row = pg.execute(
        "SELECT extract(epoch FROM max(updated_at) - %s)::float8 FROM job WHERE id = ANY(%s)",
        (held["at"], held["ids"]),
    ).fetchone()
    return round(float(row[0]), 1) if row and row[0] is not None else None


# --- (a) random kill -9 of children ----------------------------------------------------------


def test_random_kill_9_of_children(pg: psycopg.Connection[Any], dsn: str, chaos: Chaos) -> None:
    run = chaos("kill9_children", "kill -9 of a random child every 0.2-0.5 s", dsn)
    create_tables(pg)
    plan = enqueue_mix(pg, JOBS, BACKGROUND_MIX, max_ms=20)  # kills land inside handlers too
    sup = run.supervise()
    sup.wait_children(WORKERS)
    rng = random.Random(11)
    kills = 0
    deadline = time.monotonic() + 600
    while unfinished(pg) and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.2, 0.5))
        pids = worker_pids(sup)
        if pids:
            os.kill(rng.choice(pids), signal.SIGKILL)
            kills += 1
    wait_drained(pg)
    crashes = crash_exits(sup)
    run.faults = {"child_kills": kills, "crash_exits": crashes}
    # A child killed while its claim commits leaves a row the supervisor cannot
    # see yet: its lease runs out and the reaper returns it (rare, but real).
    verdict = run.finish(pg, plan, lease_faults=True)
    assert_clean(run, verdict)
    assert kills >= 5, "the run ended before the faults could bite; enlarge CHAOS_SIZE"
    assert crashes <= kills + CRASH_SLACK, f"{crashes} crashes for {kills} kills"
    assert_attempts_explained(verdict, kills + requeued(pg, sup), "kills and returned leases")
    assert_serving(sup)
    assert sup.stop() == 0


# --- (b) kill -9 of the supervisor, then a restart ----------------------------------------------


def test_kill_9_of_the_supervisor_then_restart(
    pg: psycopg.Connection[Any], dsn: str, chaos: Chaos
) -> None:
    run = chaos("kill9_supervisor", "kill -9 of the supervisor mid-run, then a new one", dsn)
    create_tables(pg)
    plan = enqueue_mix(pg, JOBS, BACKGROUND_MIX)
    first = run.supervise("first")
    first.wait_children(WORKERS)
    wait_progress(pg, 0.3)
    kids = run.kill_supervisor(first)  # asserts the children died within 2 s
    killed_at, killed_wall = time.monotonic(), time.time()
    held = held_rows(pg, [first.pid])
    second = run.supervise("second")
    second.wait_children(WORKERS)
    wait_drained(pg)
    run.faults = {
        "supervisor_kills": 1,
        "children_killed_with_it": len(kids),
        "rows_held_at_kill": len(held["ids"]),
        "requeued_after_s": requeue_s(killed_wall, second),
        "held_rows_done_after_s": recovery_s(pg, held),
        "all_done_after_s": round(time.monotonic() - killed_at, 1),
    }
    verdict = run.finish(pg, plan, lease_faults=True)
    assert_clean(run, verdict)
    if held["ids"]:
        assert second.events("JobRequeued"), "the new supervisor's reaper returned nothing"
        # within the lease (3 s) + the reaper's period (5 s) + the new supervisor's start;
        # they then queue behind the backlog (available_at = now()), as they should
        assert run.faults["requeued_after_s"] <= LEASE_S + REAPER_S + 5
    assert crash_exits(second) <= CRASH_SLACK
    assert_attempts_explained(
        verdict, requeued(pg, second) + killed(second), "returned leases and kills"
    )
    assert_serving(second)
    assert second.stop() == 0


# --- (c) a PostgreSQL restart (private cluster) -------------------------------------------------


def pg_sh(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(PG_SH), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"pg.sh {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout.strip()


@pytest.fixture
def private_pg() -> Iterator[tuple[str, dict[str, str]]]:
    """A PostgreSQL cluster of this test only (it gets restarted): (url, env for pg.sh)."""
    base = tempfile.mkdtemp(prefix="brooq-chaos-pg-", dir="/tmp")
    os.chmod(base, 0o755)  # the postgres user must traverse it when running as root
    env = {**os.environ, "BROOQ_PGDIR": f"{base}/cluster", "BROOQ_PGPORT": str(free_port())}
    try:
        pg_sh(env, "up", timeout=180)
        url = pg_sh(env, "url")
        migrations.up(url)
        yield url, env
    finally:
        try:
            pg_sh(env, "down", timeout=60)
        finally:
            shutil.rmtree(base, ignore_errors=True)


class Reconnecting:
    """An autocommit connection for the test that reconnects after the server restarted."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: psycopg.Connection[Any] | None = None

    def execute(self, query: Any, params: Any = None) -> Any:
        for _ in range(100):
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=3)
                return self.conn.execute(query, params)
            except psycopg.OperationalError:
                self.conn = None
                time.sleep(0.1)
        raise AssertionError("the private PostgreSQL did not come back within 10 s")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def test_postgresql_restart(private_pg: tuple[str, dict[str, str]], chaos: Chaos) -> None:
    url, env = private_pg
    run = chaos(
        "pg_restart",
        "PostgreSQL restarted mid-run (pg_ctl restart -m fast), "
        f"then stopped for {LONG_OUTAGE_S:g} s (longer than the lease)",
        url,
    )
    conn = Reconnecting(url)
    try:
        create_tables(conn)
        plan = enqueue_mix(conn, JOBS, BACKGROUND_MIX)
        sup = run.supervise()
        sup.wait_children(WORKERS)
        port = http_port(sup)
        with HealthPoller(port) as health:
            health.wait_status(200, 20, "/healthz 200 before the faults")
            wait_progress(conn, 0.25)
            t0 = time.monotonic()
            pg_sh(env, "restart")
            restart_s = time.monotonic() - t0
            seen_restart = health.between(t0, time.monotonic() + 1.0)
            health.wait_status(200, 30, "/healthz 200 after the restart")

            wait_progress(conn, 0.6)
            t1 = time.monotonic()
            pg_sh(env, "stop")
            time.sleep(LONG_OUTAGE_S)
            t2 = time.monotonic()
            pg_sh(env, "up")
            during_outage = health.between(t1 + 0.5, t2)
            recovered = health.wait_status(200, 30, "/healthz 200 after the outage")
        wait_drained(conn)
        crashes = crash_exits(sup)
        run.faults = {
            "pg_restarts": 1,
            "pg_down_s": LONG_OUTAGE_S,
            "restart_s": round(restart_s, 2),
            "healthz_503_during_restart": seen_restart.count(503),
            "healthz_during_outage": sorted(set(during_outage)),
            "healthz_200_after_outage_s": round(recovered - t2, 2),
            "crash_exits": crashes,
        }
        verdict = run.finish(conn, plan, lease_faults=True)
        assert_clean(run, verdict)
        assert during_outage and set(during_outage) == {503}, (
            f"/healthz during the outage: {during_outage}"
        )
        assert 503 in seen_restart + during_outage
        assert crashes <= CRASH_SLACK, f"{crashes} children crashed on a database outage"
        assert_attempts_explained(
            verdict,
            requeued(conn, sup) + crashes + killed(sup),
            "returned leases, crashes and kills",
        )
        assert len(sup.events("SupervisorStarted")) == 1
        assert_serving(sup)
        assert sup.stop() == 0
    finally:
        run.stop_all()
        conn.close()


# --- (d) pg_terminate_backend of every brooq connection ----------------------------------------

# Only the test role's own connections (brooq's): an autovacuum worker in the same database is
# not ours to kill, and the test role is not a superuser.
TERMINATE = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND usename = current_user"
)


def test_terminate_every_backend(
    pg: psycopg.Connection[Any], dsn: str, admin: psycopg.Connection[Any], chaos: Chaos
) -> None:
    run = chaos(
        "terminate_backends",
        "pg_terminate_backend of every brooq connection, 3 times, then connections refused for 2 s",
        dsn,
    )
    db = pgsql.Identifier(pg.info.dbname)
    create_tables(pg)
    plan = enqueue_mix(pg, JOBS, BACKGROUND_MIX)
    sup = run.supervise()
    sup.wait_children(WORKERS)
    port = http_port(sup)
    terminated: list[int] = []
    try:
        with HealthPoller(port) as health:
            health.wait_status(200, 20, "/healthz 200 before the faults")
            for share in (0.15, 0.3, 0.45):
                wait_progress(pg, share)
                row = pg.execute(TERMINATE).fetchone()
                terminated.append(int(row[0]) if row else 0)
                time.sleep(0.3)
            wait_progress(pg, 0.6)
            admin.execute(pgsql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(db))
            t1 = time.monotonic()
            row = pg.execute(TERMINATE).fetchone()
            terminated.append(int(row[0]) if row else 0)
            time.sleep(OUTAGE_S)
            t2 = time.monotonic()
            admin.execute(pgsql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(db))
            during_outage = health.between(t1 + 0.5, t2)
            recovered = health.wait_status(200, 30, "/healthz 200 after the outage")
    finally:
        admin.execute(pgsql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(db))
    wait_drained(pg)
    crashes = crash_exits(sup)
    run.faults = {
        "terminate_rounds": len(terminated),
        "backends_terminated": sum(terminated),
        "connections_refused_s": OUTAGE_S,
        "healthz_during_outage": sorted(set(during_outage)),
        "healthz_200_after_outage_s": round(recovered - t2, 2),
        "crash_exits": crashes,
    }
    verdict = run.finish(pg, plan, lease_faults=True)
    assert_clean(run, verdict)
    assert min(terminated) >= WORKERS, f"too few backends terminated: {terminated}"
    assert during_outage and set(during_outage) == {503}, f"/healthz: {during_outage}"
    assert crashes <= CRASH_SLACK, f"{crashes} children crashed on terminated connections"
    assert_attempts_explained(
        verdict, requeued(pg, sup) + crashes + killed(sup), "returned leases, crashes and kills"
    )
    assert_serving(sup)
    assert sup.stop() == 0


# --- (e) two supervisors, one killed -------------------------------------------------------------


def test_two_supervisors_one_killed(pg: psycopg.Connection[Any], dsn: str, chaos: Chaos) -> None:
    run = chaos(
        "two_hosts_one_killed", "two supervisors on one database, one kill -9'd mid-run", dsn
    )
    create_tables(pg)
    plan = enqueue_mix(pg, JOBS, BACKGROUND_MIX)
    host_a = run.supervise("host_a")
    host_b = run.supervise("host_b")
    host_a.wait_children(WORKERS)
    host_b.wait_children(WORKERS)
    wait_progress(pg, 0.3)
    holders = {
        r[0]
        for r in pg.execute(
            "SELECT DISTINCT split_part(locked_by, ':', 2) FROM job WHERE state = 'done'"
        )
    }
    kids = run.kill_supervisor(host_a)
    killed_wall = time.time()
    held = held_rows(pg, [host_a.pid])
    wait_drained(pg)
    run.faults = {
        "supervisor_kills": 1,
        "children_killed_with_it": len(kids),
        "rows_held_at_kill": len(held["ids"]),
        "requeued_after_s": requeue_s(killed_wall, host_b),
        "held_rows_done_after_s": recovery_s(pg, held),
    }
    verdict = run.finish(pg, plan, lease_faults=True)
    assert_clean(run, verdict)
    assert holders == {str(host_a.pid), str(host_b.pid)}, f"both hosts worked: {holders}"
    if held["ids"]:
        assert host_b.events("JobRequeued"), "the surviving supervisor's reaper returned nothing"
        assert run.faults["requeued_after_s"] <= LEASE_S + REAPER_S + 2
    assert crash_exits(host_b) <= CRASH_SLACK
    assert_attempts_explained(verdict, requeued(pg, host_a, host_b), "returned leases")
    assert_serving(host_b)
    assert host_b.stop() == 0


# --- (f) handler exceptions, hangs and self-kills -------------------------------------------------


def test_handler_exceptions_hangs_and_self_kills(
    pg: psycopg.Connection[Any], dsn: str, chaos: Chaos
) -> None:
    run = chaos(
        "handler_faults",
        "handlers raising (3%), hanging deaf to signals (1%), "
        "SIGKILLing themselves (2%), poison (1%)",
        dsn,
    )
    create_tables(pg)
    plan = enqueue_mix(pg, JOBS, HANDLER_MIX)
    sup = run.supervise()
    sup.wait_children(WORKERS)
    wait_drained(pg)
    side = read_side_log(run.side_dir)
    hang_at = {
        job_id: e.ts for job_id, entries in side.items() for e in entries if e.event == "hang"
    }
    self_kills = sum(1 for entries in side.values() for e in entries if e.event == "selfkill")
    killed = {e["job_id"]: e["ts"] for e in sup.events("WorkerKilled")}
    hung_exits = len(sup.events("WorkerExited", reason="hung"))
    crashes = crash_exits(sup)
    lease_lost = [e for e in sup.events("LeaseLost") if e.get("logger") == "brooq.supervisor"]
    waits = sorted(killed[j] - t for j, t in hang_at.items() if j in killed)
    run.faults = {
        "raises": plan.count("raise"),
        "hangs": len(hang_at),
        "self_kills": self_kills,
        "poison": plan.count("poison"),
        "hung_exits": hung_exits,
        "crash_exits": crashes,
        "lease_lost_interrupts": len(lease_lost),
        "hang_to_kill_max_s": round(waits[-1], 2) if waits else None,
    }
    verdict = run.finish(pg, plan, strict=True)
    assert_clean(run, verdict)
    assert len(hang_at) == plan.count("hang") and self_kills == plan.count("selfkill")
    assert set(hang_at) <= set(killed), "a hung handler was never killed"
    # attempt_timeout (1 s) + watchdog grace (1 s) + one supervisor tick + slack
    assert waits[-1] <= 1.0 + 1.0 + 1.5, f"hangs lasted up to {waits[-1]:.2f}s"
    assert hung_exits == len(hang_at), f"{hung_exits} hung exits for {len(hang_at)} hangs"
    assert crashes == self_kills, f"{crashes} crash exits for {self_kills} self-kills"
    # No lease can be lost when only handlers misbehave: a LeaseLost here is the
    # heartbeat racing a settle, and its interrupt hits the child's next job.
    assert not lease_lost, f"spurious lease-lost interrupts: {lease_lost[:3]}"
    assert_serving(sup)
    assert sup.stop() == 0


def test_reaper_period_is_what_the_rig_assumes() -> None:
    """The rig's timing assumptions (lease 3 s, reaper max(5 s, lease/4)) hold in config."""
    from brooq.config import load_settings

    settings = load_settings(environ={}, env_file=None, overrides={"QUEUE_LEASE": f"{LEASE_S:g}s"})
    assert settings.reaper_period.total_seconds() == REAPER_S
