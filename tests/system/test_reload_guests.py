"""The supervisor never waits for its guests: an app's import on SIGHUP, a busy worker during a
roll, a handler that ignores the interrupt signals, a payload too large for a worker.

Real ``brooq supervise`` processes, an app file rewritten on disk, real signals. The app
tells the throwaway check from the supervisor by PROMETHEUS_MULTIPROC_DIR, which only the
supervisor has (the check runs without it). Every wait is bounded.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import children_of, insert_jobs, job, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = """
import os
import signal
import subprocess
import time

import brooq

IN_SUPERVISOR = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
queue = brooq.Queue(os.environ["DATABASE_URL"])
{on_import}


@queue.kind("work", attempt_timeout="1s", watchdog_grace="10s", max_attempts=1)
def work(claim: brooq.Claim) -> None:
    p = claim.payload or {{}}
    if p.get("ignore_signals"):
        for signum in (signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_IGN)
    time.sleep(float(p.get("sleep", 0.01)))


@queue.kind("long7", attempt_timeout="30s")
def long7(claim: brooq.Claim) -> None:
    time.sleep(7)
{more_kinds}
"""
ARGS = ("--workers", "2", "--poll-interval", "200ms", "--graceful-timeout", "3s")


def write_app(directory: Path, on_import: str = "", more_kinds: str = "", tag: str = "") -> None:
    text = APP.format(on_import=on_import, more_kinds=more_kinds)
    text += "#" * (len(on_import + more_kinds + tag) % 97 + 1) + f"  {tag}\n"  # a new size
    (directory / "guestapp.py").write_text(text)


def start(supervise: Any, tmp_path: Path, *args: str, lease: str = "30s", env: Any = None) -> Any:
    sup = supervise(
        *ARGS,
        "--lease",
        lease,
        *args,
        app="guestapp:queue",
        env={"PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
    )
    sup.wait_event("SupervisorReady", 30)
    return sup


def healthz(sup: Any) -> int:
    """/healthz's status (503 while a worker is replaced is an answer too); 0: no answer."""
    try:
        with urllib.request.urlopen(f"http://{sup.env_used['HTTP_ADDR']}/healthz", timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def charged(pg: psycopg.Connection[Any], job_id: str) -> tuple[str, int, int]:
    """(state, attempts, expirations) of a job."""
    row = pg.execute(
        "SELECT state, attempts, expirations FROM job WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


@pytest.mark.timeout(120)
def test_a_slow_import_on_sighup_never_stalls_the_loop(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """The new code takes 4 s to import, everywhere; a 7 s job runs across the reload with a
    2 s lease: its lease is kept (it runs once), /healthz answers all along, jobs keep flowing."""
    write_app(tmp_path)
    sup = start(supervise, tmp_path, lease="2s", env={"QUEUE_REAPER_PERIOD": "1s"})
    # Another supervisor's reaper takes any lease that runs out meanwhile, as in a fleet.
    start(supervise, tmp_path, "--topics", "work", lease="2s", env={"QUEUE_REAPER_PERIOD": "1s"})
    (long_id,) = insert_jobs(pg, "work", [{"sleep": 0.9}])
    wait_until(lambda: job(pg, long_id)["state"] == "done", 10, "a first job")
    write_app(tmp_path, on_import="time.sleep(4)", tag="slow")
    (running,) = insert_jobs(pg, "long7", [{}])
    sup.send(signal.SIGHUP)
    answered, t0 = [], time.monotonic()
    while time.monotonic() - t0 < 9:  # the check (4 s) and the load (4 s)
        answered.append(healthz(sup))
        insert_jobs(pg, "work", [{"sleep": 0.01}])
        time.sleep(0.25)
    sup.wait_event("SupervisorReloaded", 30)
    assert answered.count(0) == 0, f"/healthz did not answer: {answered}"
    wait_until(lambda: charged(pg, running)[0] == "done", 15, "the long job done")
    assert charged(pg, running) == ("done", 1, 0)
    wait_until(
        lambda: pg.execute("SELECT count(*) FROM job WHERE state <> 'done'").fetchone() == (0,),
        20,
        "every job done",
    )
    assert pg.execute("SELECT max(attempts) FROM job").fetchone() == (1,)
    assert not sup.events("ReloadFailed")
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_an_import_that_hangs_in_the_supervisor_is_a_reload_failed(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    write_app(tmp_path)
    sup = start(supervise, tmp_path)
    workers = sup.children()
    write_app(tmp_path, on_import="if IN_SUPERVISOR:\n    time.sleep(3600)", tag="hang")
    sup.send(signal.SIGHUP)
    time.sleep(1.0)  # the check passed; the supervisor's own import hangs now
    (during,) = insert_jobs(pg, "work", [{}])
    wait_until(lambda: job(pg, during)["state"] == "done", 3, "a job while the import hangs")
    failed = sup.wait_event("ReloadFailed", 20)
    assert "took longer" in failed["error"]
    assert sup.children() == workers and not sup.exited()
    (after,) = insert_jobs(pg, "work", [{}])
    wait_until(lambda: job(pg, after)["state"] == "done", 5, "the old workers serve on")
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_system_exit_at_import_is_a_reload_failed_not_an_exit(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    write_app(tmp_path)
    sup = start(supervise, tmp_path)
    write_app(tmp_path, on_import="if IN_SUPERVISOR:\n    raise SystemExit(3)", tag="exit")
    sup.send(signal.SIGHUP)
    failed = sup.wait_event("ReloadFailed", 20)
    assert "SystemExit" in failed["error"]
    time.sleep(0.5)
    assert not sup.exited()
    (after,) = insert_jobs(pg, "work", [{}])
    wait_until(lambda: job(pg, after)["state"] == "done", 5, "the old workers serve on")
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_what_an_import_forks_does_not_outlive_the_reload(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    write_app(tmp_path)
    sup = start(supervise, tmp_path)
    forks = (
        "subprocess.Popen(['sleep', '300'])\n"
        "if os.fork() == 0:\n"
        "    time.sleep(300)\n"
        "    os._exit(0)"
    )
    write_app(tmp_path, on_import=forks, tag="forks")
    sup.send(signal.SIGHUP)
    sup.wait_event("SupervisorReloaded", 30)
    sup.wait_event("SupervisorReady", 30, generation=1)

    def strays() -> list[int]:
        workers = {e["pid"] for e in sup.events("WorkerStarted")}
        return [p for p in children_of(sup.pid) if p not in workers]

    wait_until(lambda: not strays(), 5, "no process but workers under the supervisor")
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_a_roll_replaces_idle_workers_at_once_and_stops_a_busy_one_after_the_timeout(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """SIGHUP with a 60 s job running and --graceful-timeout 3s: the idle worker is replaced
    at once; the busy one is stopped after 3 s, its job back to pending uncharged."""
    write_app(tmp_path, more_kinds=LONG_KIND)
    sup = start(supervise, tmp_path)
    (long_id,) = insert_jobs(pg, "long", [{}])
    wait_until(lambda: sup.child_running(long_id), 10, "the long job to start")
    busy = sup.child_running(long_id)
    idle = [p for p in sup.children() if p != busy]
    write_app(tmp_path, more_kinds=LONG_KIND, tag="v2")
    sent = time.monotonic()
    sup.send(signal.SIGHUP)
    wait_until(lambda: not set(idle) & set(sup.children()), 10, "the idle worker replaced")
    idle_gone = time.monotonic() - sent
    sup.wait_event("SupervisorReady", 20, generation=1)
    rolled = time.monotonic() - sent
    assert idle_gone < 2.5, idle_gone
    assert 3 <= rolled < 10, rolled
    wait_until(lambda: charged(pg, long_id)[0] == "processing", 10, "the job to run again")
    assert charged(pg, long_id) == ("processing", 1, 0)  # released uncharged, taken again
    assert sup.stop(timeout=10) is not None


LONG_KIND = """

@queue.kind("long", attempt_timeout="5m", max_execution_timeout="10m")
def long(claim: brooq.Claim) -> None:
    time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_handler_that_ignores_the_signals_does_not_disarm_the_next_job(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    write_app(tmp_path)
    sup = start(supervise, tmp_path, "--workers", "1")
    (first,) = insert_jobs(pg, "work", [{"ignore_signals": True}])
    wait_until(lambda: job(pg, first)["state"] == "done", 10, "the first job")
    (slow,) = insert_jobs(pg, "work", [{"sleep": 8}])
    row = wait_until(lambda: (r := job(pg, slow))["state"] == "dead" and r, 6, "the timeout")
    assert "AttemptTimedOut" in (row["last_error"] or ""), row
    assert not sup.events("WorkerKilled")
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_a_payload_too_large_for_a_worker_is_dead_with_its_reason(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    write_app(tmp_path)
    sup = start(supervise, tmp_path)
    workers = sup.children()
    huge = pg.execute(
        "INSERT INTO job (topic, payload) "
        "VALUES ('work', jsonb_build_object('x', repeat('a', 65 * 1024 * 1024))) RETURNING id"
    ).fetchone()
    assert huge is not None
    pg.execute("NOTIFY brooq_job, 'work'")
    row = wait_until(lambda: (r := job(pg, str(huge[0])))["state"] == "dead" and r, 30, "dead")
    assert "PayloadTooLarge" in (row["last_error"] or ""), row["last_error"]
    assert sup.children() == workers and not sup.events("WorkerExited")
    (after,) = insert_jobs(pg, "work", [{}])
    wait_until(lambda: job(pg, after)["state"] == "done", 5, "the workers serve on")
    assert sup.stop() == 0
