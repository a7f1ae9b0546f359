"""The worker's sharp edges (issue 32, items 1, 2 and 16), through real supervisors.

Real ``brooq supervise`` processes (apps/worker_edges.py), real SIGSTOP and
SIGCONT, real PostgreSQL; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import Supervisor, alive, count, insert_jobs, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = "worker_edges:queue"
REAPER = {"QUEUE_REAPER_PERIOD": "1s"}


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


# --- item 2: a worker that dies inside its settle ----------------------------------------------


def get_health(sup: Supervisor) -> tuple[int, dict[str, Any]]:
    """/healthz of ``sup``: (status, body)."""
    url = f"http://{sup.wait_event('SupervisorStarted', 15)['http']}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def row(pg: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    """state, attempts and last_error of one job."""
    found = pg.execute(
        "SELECT state, attempts, last_error FROM job WHERE id = %s", (job_id,)
    ).fetchone()
    assert found is not None
    return dict(zip(["state", "attempts", "last_error"], found, strict=True))


@pytest.mark.timeout(120)
def test_a_worker_that_dies_in_its_settle_while_a_grandchild_keeps_its_socket_wedges_nothing(
    pg: psycopg.Connection[Any], tmp_path: Path, supervise: Callable[..., Supervisor]
) -> None:
    """The issue's steps: an effect opens the worker's connection, a handler leaves a
    grandchild (its own session, SIGTERM ignored) holding that socket, a hook ends the worker
    inside its settle transaction, five plain jobs follow. The aborted settle's session ends
    within the idle bound (lease/12, at least 1 s), so its row locks never hold the
    supervisor's heartbeats or flushes: the five plain jobs are written at their first
    attempt. Before: the backend stayed idle in transaction, every flush was cut, the plain
    jobs ran 15 times in 30 s and none was recorded done, /healthz said ok."""
    sup = supervise(
        "--workers", "1", "--lease", "6s", "--poll-interval", "100ms", app=APP, env=REAPER
    )
    sup.wait_children(1)
    pidfile = tmp_path / "grandchild.pid"
    (effect,) = insert_jobs(pg, "wedge.effect", [{}])
    (fork,) = insert_jobs(pg, "wedge.fork", [{"pidfile": str(pidfile)}])
    (exits,) = insert_jobs(pg, "wedge.exit", [{}])
    plains = insert_jobs(pg, "plain", [{}] * 5)
    grandchild = 0
    try:
        grandchild = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), 20))
        wait_until(lambda: done(pg, plains), 20, "the five plain jobs to be written")
        assert all(row(pg, job_id)["attempts"] == 1 for job_id in plains), [
            row(pg, job_id) for job_id in plains
        ]
        assert alive(grandchild), "the grandchild (and the socket it holds) should still be there"
    finally:
        if grandchild and alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
    assert row(pg, effect)["state"] == "done" and row(pg, fork)["state"] == "done"
    ended = row(pg, exits)
    assert ended["state"] == "dead", ended
    assert ended["last_error"] == (
        "WorkerCrashed: worker process exited with code 3 while running the handler"
    )
    assert sup.events("FlushFailed") == [] and sup.events("DatabaseStuck") == []
    assert get_health(sup)[0] == 200


@pytest.mark.timeout(120)
def test_a_hook_that_holds_its_settle_transaction_idle_is_cut_off_at_the_idle_bound(
    pg: psycopg.Connection[Any], supervise: Callable[..., Supervisor]
) -> None:
    """A hook that sleeps 4 s inside the settle transaction, holding its job's row: PostgreSQL
    ends that session after the idle bound (1 s with a 6 s lease), so the heartbeat, which
    extends that row too, is never stuck behind it; the other worker's jobs are written
    meanwhile. Before: every heartbeat waited for the hook and was cut as stuck."""
    sup = supervise(
        "--workers", "2", "--lease", "6s", "--poll-interval", "100ms", app=APP, env=REAPER
    )
    sup.wait_children(2)
    (idle,) = insert_jobs(pg, "wedge.idle", [{"seconds": 4}])
    wait_until(lambda: row(pg, idle)["state"] == "processing", 10, "the idle hook's job to run")
    time.sleep(0.5)  # the hook holds the row now
    plains = insert_jobs(pg, "plain", [{}] * 3)
    wait_until(lambda: done(pg, plains), 5, "the other worker's jobs to be written")
    # Its settle failed twice (it is tried again once): nothing written, it will run again.
    event = sup.wait_event("DatabaseUnavailable", 20, logger="brooq.child", job_id=idle)
    assert "idle-in-transaction" in event["error"], event
    assert sup.events("DatabaseStuck") == [], sup.events("DatabaseStuck")


@pytest.mark.timeout(120)
def test_healthz_fails_while_outcomes_cannot_be_written(
    pg: psycopg.Connection[Any], dsn: str, tmp_path: Path, supervise: Callable[..., Supervisor]
) -> None:
    """Another session holds the rows of finished jobs (an operator's open transaction): their
    outcomes cannot be written, and /healthz says so (503) once one has waited 10 s; it is 200
    again once they are written. Before: /healthz said ok throughout."""
    sup = supervise("--workers", "2", "--lease", "60s", "--poll-interval", "100ms", app=APP)
    sup.wait_children(2)
    gate = tmp_path / "gate"
    ids = insert_jobs(pg, "wedge.gate", [{"gate": str(gate)}] * 2)
    wait_until(
        lambda: count(pg, "id = ANY(%s::uuid[]) AND state = 'processing'", [ids]) == 2,
        10,
        "both jobs to run",
    )
    assert get_health(sup)[0] == 200
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT id FROM job WHERE id = ANY(%s::uuid[]) FOR UPDATE", [ids])
        gate.touch()  # the handlers return: their outcomes wait for the rows
        wait_until(
            lambda: (answer := get_health(sup))[0] == 503 and "outcomes" in answer[1]["reason"],
            20,
            "/healthz to say outcomes cannot be written",
        )
        holder.rollback()
    wait_until(lambda: done(pg, ids), 20, "the outcomes to be written")
    wait_until(lambda: get_health(sup)[0] == 200, 10, "/healthz to be 200 again")


# --- item 16: a worker's idle connection -------------------------------------------------------


def backend_alive(pg: psycopg.Connection[Any], pid: int) -> bool:
    """True while a backend of ``pid`` serves this database."""
    found = pg.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND datname = current_database()",
        (pid,),
    ).fetchone()
    return found is not None and found[0] == 1


def clients(pg: psycopg.Connection[Any]) -> int:
    """Client connections to this database, the test's own left out."""
    found = pg.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    ).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.timeout(120)
def test_a_workers_connection_is_closed_once_idle_and_opened_again_by_its_next_effect(
    pg: psycopg.Connection[Any], tmp_path: Path, supervise: Callable[..., Supervisor]
) -> None:
    """QUEUE_WORKER_CONNECTION_IDLE=2s: the connection a job with effects opened is closed 2 s
    after its last use, whether the worker waits for work or runs plain jobs back to back,
    and the next job with effects opens a new one. Before: it stayed open for good (3 + one
    per worker that ever ran such a job)."""
    sup = supervise(
        "--workers", "1", "--poll-interval", "100ms",
        app=APP, env={"QUEUE_WORKER_CONNECTION_IDLE": "2s"},
    )  # fmt: skip
    sup.wait_children(1)
    backends = tmp_path / "backends"

    def settled_by() -> list[int]:
        return [int(line) for line in backends.read_text().split()] if backends.exists() else []

    wait_until(lambda: clients(pg) == 3, 10, "the supervisor's three connections")
    first = insert_jobs(pg, "effect.backend", [{"file": str(backends)}])
    wait_until(lambda: done(pg, first), 15, "the first job with effects")
    (opened,) = settled_by()
    assert backend_alive(pg, opened) and clients(pg) == 4
    # The worker waits for work: its wait times out once, at the bound, and closes it.
    wait_until(lambda: not backend_alive(pg, opened), 6, "the idle connection to be closed")
    assert clients(pg) == 3

    second = insert_jobs(pg, "effect.backend", [{"file": str(backends)}])
    wait_until(lambda: done(pg, second), 15, "the second job with effects")
    reopened = settled_by()[-1]
    assert reopened != opened and backend_alive(pg, reopened)
    # Busy with plain jobs (12 x 0.3 s) and never waiting: closed between two of them.
    plains = insert_jobs(pg, "sleep", [{"seconds": 0.3}] * 12)
    wait_until(lambda: not backend_alive(pg, reopened), 6, "the connection to be closed")
    assert not done(pg, plains), "closed only once the worker had nothing left to do"
    wait_until(lambda: done(pg, plains), 15, "the plain jobs")
    assert clients(pg) == 3
