"""Everything through a real PgBouncer in transaction mode (pool of 8 server connections).

Debian's pgbouncer is installed by the set-up when missing (tests/system/bouncer.py).
Drain, kill -9 and recover, cancel of a running job, periodic jobs, ``brooq
work``, enqueue in the caller's transaction and the CLI commands all run with
DATABASE_URL pointing at the bouncer and QUEUE_PGBOUNCER=true; the server
connections never exceed the pool. Every wait is bounded.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.system.bouncer import PgBouncer
from tests.system.harness import (
    alive,
    all_terminal,
    count,
    insert_jobs,
    job,
    run_cli,
    states,
    wait_until,
)

pytestmark = [pytest.mark.system, pytest.mark.db]

POOL = 8
FAST = ("--poll-interval", "200ms", "--graceful-timeout", "3s")


@pytest.fixture(scope="module")
def bouncer(server_url: str) -> Iterator[PgBouncer]:
    b = PgBouncer(server_url, pool_size=POOL).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def via(bouncer: PgBouncer, dsn: str) -> str:
    """The test database's URL through the bouncer."""
    return bouncer.url(dsn)


def bounced(via: str, listen: str | None = None) -> dict[str, str]:
    env = {"DATABASE_URL": via, "QUEUE_PGBOUNCER": "true"}
    if listen:
        env["QUEUE_LISTEN_URL"] = listen
    return env


def create_handled(pg: psycopg.Connection[Any]) -> None:
    pg.execute("CREATE TABLE handled (job_id uuid NOT NULL UNIQUE)")


def handled(pg: psycopg.Connection[Any]) -> int:
    row = pg.execute("SELECT count(*) FROM handled").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.timeout(90)
def test_drain_through_the_bouncer_polls_and_says_so_once(
    pg: psycopg.Connection[Any], supervise: Any, bouncer: PgBouncer, via: str, dsn: str
) -> None:
    create_handled(pg)
    total = 600
    sup = supervise("--workers", "3", *FAST, env=bounced(via))
    sup.wait_children(3)
    insert_jobs(pg, "work", [{"record": True}] * total)
    peak = 0

    def drained() -> bool:
        nonlocal peak
        peak = max(peak, bouncer.server_connections())
        return count(pg, "state = 'done'") == total

    wait_until(drained, 60, f"{total} jobs done through the bouncer", interval=0.1)
    assert states(pg) == {"done": total}
    assert count(pg, "attempts <> 1") == 0
    assert handled(pg) == total
    assert len(sup.events("ListenOff")) == 1
    assert peak <= POOL
    # Nothing of brooq's holds a session on the server: no LISTEN, no prepared statement.
    rows = pg.execute(
        "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    ).fetchall()
    assert not [q for (q,) in rows if "LISTEN" in q.upper() or "EXECUTE" in q.upper()]
    assert sup.stop() == 0


@pytest.mark.timeout(90)
def test_kill_9_then_a_new_supervisor_recovers_through_the_bouncer(
    pg: psycopg.Connection[Any], supervise: Any, via: str
) -> None:
    args = ("--workers", "2", "--lease", "3s", *FAST)
    first = supervise(*args, name="first", env=bounced(via))
    first.wait_children(2)
    ids = insert_jobs(pg, "work", [{"sleep": 2}] * 4)
    wait_until(lambda: count(pg, "state = 'processing'") == 2, 10, "2 jobs in flight")
    pids = first.children()
    first.send(signal.SIGKILL)
    wait_until(lambda: not any(alive(p) for p in pids), 3.0, "the children to die too")
    first.wait_exit(5)
    in_flight = {str(r[0]) for r in pg.execute("SELECT id FROM job WHERE state = 'processing'")}
    assert len(in_flight) == 2

    second = supervise(*args, name="second", env=bounced(via))
    wait_until(lambda: count(pg, "state = 'done'") == 4, 40, "every job done after the lease")
    for job_id in ids:
        row = job(pg, job_id)
        assert row["last_error"] is None, row
        assert row["attempts"] == (2 if job_id in in_flight else 1), row
    assert second.stop() == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("listen", ["direct", "none"])
def test_cancel_of_a_running_job_through_the_bouncer(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path, via: str, dsn: str, listen: str
) -> None:
    """With QUEUE_LISTEN_URL the NOTIFY interrupts at once; without, the heartbeat does
    (lease/3 = 1 s here)."""
    sup = supervise(
        "--workers",
        "2",
        "--lease",
        "3s",
        *FAST,
        env=bounced(via, dsn if listen == "direct" else None),
    )
    sup.wait_children(2)
    mark = tmp_path / "interrupted"
    (target,) = insert_jobs(pg, "work", [{"loop": 30, "mark": str(mark)}])
    wait_until(lambda: sup.child_running(target), 10, "the child running the job")
    time.sleep(0.3)
    done = run_cli(via, tmp_path, "cancel", target, env={"QUEUE_PGBOUNCER": "true"})
    canceled_at = time.time()
    assert done.returncode == 0, done.stderr
    wait_until(
        lambda: mark.exists() and mark.read_text().count(" ") == 1,
        5.0,
        "the handler to be interrupted",
    )
    reason, at = mark.read_text().split()
    if listen == "direct":
        assert reason == "JobCanceledWhileRunning"
        assert float(at) - canceled_at < 1.5
        assert not sup.events("ListenOff")
    else:
        assert reason in ("JobCanceledWhileRunning", "LeaseLost")
        assert float(at) - canceled_at < 2.5
        assert len(sup.events("ListenOff")) == 1
    wait_until(lambda: job(pg, target)["state"] == "canceled", 5, "canceled")
    assert job(pg, target)["attempts"] == 1
    assert sup.events("WorkerKilled") == []
    assert sup.stop() == 0


@pytest.mark.timeout(60)
def test_periodic_jobs_through_the_bouncer(
    pg: psycopg.Connection[Any], supervise: Any, via: str
) -> None:
    sup = supervise("--workers", "2", *FAST, app="sysapp_periodic:queue", env=bounced(via))
    sup.wait_children(2)
    wait_until(
        lambda: count(pg, "topic = 'tick' AND state = 'done'") >= 1,
        20,
        "the periodic run enqueued and done",
    )
    rows = pg.execute("SELECT idempotency_key FROM job WHERE topic = 'tick'").fetchall()
    assert all(k.startswith("periodic:every-minute:") for (k,) in rows)
    assert len(sup.events("PeriodicEnqueued")) == len(rows)
    assert sup.stop() == 0


@pytest.mark.timeout(60)
def test_enqueue_in_the_callers_transaction_and_brooq_work_through_the_bouncer(
    pg: psycopg.Connection[Any], tmp_path: Path, via: str
) -> None:
    create_handled(pg)
    pg.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    queue = brooq.Queue(via, pgbouncer=True)
    # More than psycopg's prepare threshold (5) of the same statement, on one connection.
    with psycopg.connect(via, prepare_threshold=None) as conn:
        for n in range(12):
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (%s)", (n,))
                queue.enqueue(brooq.Job(topic="work", payload={"record": True, "n": n}), conn=conn)
        with conn.transaction(force_rollback=True):
            conn.execute("INSERT INTO orders VALUES (100)")
            queue.enqueue(brooq.Job(topic="work", payload={"n": 100}), conn=conn)
    for n in range(12):  # the Queue's own connection, no caller transaction
        queue.enqueue(brooq.Job(topic="work", payload={"record": True, "n": 20 + n}))
    assert count(pg) == 24 and count(pg, "payload->>'n' = '100'") == 0

    done = run_cli(
        via,
        tmp_path,
        "work",
        "--app",
        "sysapp:queue",
        "--exit-when-idle",
        env={"QUEUE_PGBOUNCER": "true", "QUEUE_POLL_INTERVAL": "200ms"},
        timeout=45,
    )
    assert done.returncode == 0, done.stderr
    assert "ListenOff" in done.stderr + done.stdout
    assert states(pg) == {"done": 24}
    assert handled(pg) == 24


@pytest.mark.timeout(60)
def test_bulk_enqueue_with_copy_through_the_bouncer(pg: psycopg.Connection[Any], via: str) -> None:
    """Issue 32, item 17: a keyless batch is written with COPY; through a transaction pooler
    it is one more statement of a transaction (the queue's own, or the caller's)."""
    queue = brooq.Queue(via, pgbouncer=True)
    jobs = [brooq.Job(topic="work", payload={"n": n, "text": "a\tb\\c"}) for n in range(300)]
    try:
        for _ in range(3):  # the queue's own connection: one transaction per batch
            assert all(e.created for e in queue.enqueue_many(jobs))
        with psycopg.connect(via, prepare_threshold=None) as conn:
            with conn.transaction():
                queue.enqueue_many(jobs, conn=conn)
            with conn.transaction(force_rollback=True):
                queue.enqueue_many(jobs, conn=conn)
    finally:
        queue.close()
    assert count(pg) == 1200
    assert count(pg, "payload->>'text' = %s", ("a\tb\\c",)) == 1200


@pytest.mark.timeout(60)
def test_cli_commands_through_the_bouncer(
    pg: psycopg.Connection[Any], tmp_path: Path, via: str
) -> None:
    env = {"QUEUE_PGBOUNCER": "true"}

    def cli(*args: str) -> str:
        done = run_cli(via, tmp_path, *args, env=env)
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    job_id = json.loads(cli("enqueue", "--topic", "work", "--payload", '{"n": 1}'))["id"]
    assert count(pg, "id = %s", (job_id,)) == 1
    for _ in range(7):  # past any prepare threshold
        cli("enqueue", "--topic", "work", "--payload", "{}")
    assert job_id in cli("job", job_id)
    assert "work" in cli("status")
    assert "canceled" in cli("cancel", job_id)
    assert "QUEUE_PGBOUNCER" in cli("config", "show")
    cli("migrate", "status")
    assert all_terminal(pg) is False
