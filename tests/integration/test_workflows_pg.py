"""Workflows on PostgreSQL where concurrency decides: two parents of one child settled by two
transactions at once, an enqueue racing its parent's settle, operator retries, NOTIFYs,
and the rollback of migration 0012.

The edge is exact because of where it is resolved: in the statement that ends the parent
(its transaction), on the child's own row (a counter of parents left, re-read under the
row lock: two settles of two parents of one child serialize on it, and exactly one brings
it to zero). These tests hold one transaction open at the point that matters and check
what the other one does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from brooq.engine.edges import MISSING_PARENT_GRACE
from brooq.engine.filters import JobFilter
from brooq.engine.outcome import DONE
from brooq.engine.reaper import Reaper
from brooq.engine.store import Ticket
from brooq.engine.timer import Every
from brooq.postgres import migrations
from brooq.postgres.admin import PostgresAdmin
from brooq.postgres.enqueue import enqueue_on
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job, Parent, State, Workflow
from tests.integration.partitions import DAY, insert_rows, midnight, past_layout
from tests.integration.test_contract import dead_outcome

pytestmark = pytest.mark.db

LEASE = timedelta(minutes=5)


@pytest.fixture
def store(dsn: str) -> Iterator[PostgresStore]:
    s = PostgresStore(dsn)
    yield s
    s.close()


def add(store: PostgresStore, topic: str = "work", **kw: Any) -> str:
    (result,) = store.enqueue_many([Job(topic, **kw)])
    return result.id


def take_all(store: PostgresStore, topic: str = "work") -> dict[str, Ticket]:
    return {c.id: c.ticket for c in store.claim_many("w1", [topic], LEASE, 1000)}


def fetch(pg: psycopg.Connection[Any], job_id: str) -> tuple[str, int, str | None]:
    row = pg.execute(
        "SELECT state, parents_left, last_error FROM job WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def waits_for_a_lock(pg: psycopg.Connection[Any], pid: int, timeout: float = 10.0) -> None:
    """Until backend ``pid`` waits for a row lock (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = pg.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited for a lock")


def notifications(dsn: str, channel: str) -> tuple[psycopg.Connection[Any], list[str]]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"LISTEN {channel}")
    return conn, []


def drain_notifies(conn: psycopg.Connection[Any], into: list[str]) -> list[str]:
    for n in conn.notifies(timeout=0.5, stop_after=None):
        into.append(n.payload)
    return into


@pytest.mark.parametrize("first_ends", ["done", "dead"])
def test_two_parents_settled_at_once_fire_the_child_exactly_once(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore, first_ends: str
) -> None:
    """T1 settles P1 and holds its transaction open; T2 settles P2 meanwhile. T2's snapshot
    cannot see T1's settle, yet T2 must not miss: it waits for the child's row lock and
    then counts down T1's write. And they must not both fire: the counter moves once each."""
    p1, p2 = add(store), add(store)
    child = add(store, "child.topic", after=[p1, p2], if_parent_fails="run")
    tickets = take_all(store)
    listener, woke = notifications(dsn, "brooq_job")
    with psycopg.connect(dsn) as t1_conn:
        t1 = PostgresStore(t1_conn)
        t1_conn.execute("SELECT 1")  # the transaction is open from here
        outcome = DONE if first_ends == "done" else dead_outcome()
        assert t1.settle_many([(tickets[p1], outcome)]) == {p1}
        assert fetch(t1_conn, child)[:2] == ("waiting", 1)  # T1 sees its own count down
        assert fetch(pg, child)[:2] == ("waiting", 2)  # nobody else does yet
        t2_pid: list[int] = []
        done: list[set[str]] = []

        def t2() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                t2_pid.append(conn.info.backend_pid)
                done.append(PostgresStore(conn).settle_many([(tickets[p2], DONE)]))

        thread = threading.Thread(target=t2)
        thread.start()
        while not t2_pid:
            time.sleep(0.01)
        waits_for_a_lock(pg, t2_pid[0])  # on the child's row, held by T1
        t1_conn.commit()
    thread.join(timeout=10)
    assert done == [{p2}]
    assert fetch(pg, child) == ("pending", 0, None)
    edges = pg.execute(
        "SELECT parent_id::text, parent_state FROM job_edge WHERE child_id = %s", (child,)
    ).fetchall()
    assert dict(edges) == {p1: first_ends, p2: "done"}
    assert drain_notifies(listener, woke).count("child.topic") == 1  # woken once
    listener.close()


def test_many_parents_settled_by_racing_completers_count_down_exactly(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    parents = [add(store) for _ in range(40)]
    child = add(store, "fan.in", after=parents)
    tickets = list(take_all(store).values())
    listener, woke = notifications(dsn, "brooq_job")
    errors: list[BaseException] = []

    def settle(share: list[Ticket]) -> None:
        s = PostgresStore(dsn)
        try:
            for i in range(0, len(share), 3):
                s.settle_many([(t, DONE) for t in share[i : i + 3]])
        except BaseException as exc:
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=settle, args=(tickets[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert fetch(pg, child) == ("pending", 0, None)
    assert drain_notifies(listener, woke).count("fan.in") == 1
    listener.close()


def test_an_enqueue_that_commits_while_its_parent_ends_is_resolved_by_the_reaper(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    """The enqueue reads its parent live and commits after the parent's settle: the settle
    could not see the edge (it did not exist for it), the enqueue saw no end. The edge is
    stranded, never early: the reaper's safety net resolves it on its next pass."""
    parent = add(store)
    (ticket,) = take_all(store).values()
    with psycopg.connect(dsn) as conn:
        (child,) = enqueue_on(conn, [Job("child", after=[parent])])
        assert child.state is State.WAITING
        assert store.settle(ticket, DONE)  # commits while the enqueue is still open
        conn.commit()
    assert fetch(pg, child.id)[:2] == ("waiting", 1)
    assert store.claim("w1", ["child"], LEASE) is None  # never early
    Reaper(store, Every(timedelta(seconds=5))).run_once()
    assert fetch(pg, child.id) == ("pending", 0, None)


def test_a_child_of_a_parent_not_committed_yet_waits_for_it_and_runs_after_it(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    """Issue 32, item 12: the parent's enqueue is still open (``enqueue(…, conn=…)``) when
    its child is enqueued on another connection, which cannot see it. The child was
    canceled for good ("parent … does not exist"); now its edge stays open, the reaper
    leaves it (within the grace), and the parent's settle makes it pending."""
    with psycopg.connect(dsn) as conn:
        (parent,) = enqueue_on(conn, [Job("work")])  # not committed
        (child,) = store.enqueue_many([Job("child", after=[parent.id])])  # committed
        assert child.state is State.WAITING
        assert fetch(pg, child.id) == ("waiting", 1, None)
        Reaper(store, Every(timedelta(seconds=5))).run_once()  # the parent is unseen yet
        assert fetch(pg, child.id) == ("waiting", 1, None)
        conn.commit()
    Reaper(store, Every(timedelta(seconds=5))).run_once()
    assert fetch(pg, child.id) == ("waiting", 1, None)
    assert store.claim("w1", ["child"], LEASE) is None  # never before its parent
    (ticket,) = take_all(store).values()
    assert store.settle(ticket, DONE)
    assert fetch(pg, child.id) == ("pending", 0, None)
    assert store.parents(child.id) == {parent.id: Parent(State.DONE)}
    claimed = store.claim("w1", ["child"], LEASE)
    assert claimed is not None and claimed.id == child.id


def test_a_parent_whose_enqueue_rolled_back_is_missing_once_the_grace_is_over(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    with psycopg.connect(dsn) as conn:
        (parent,) = enqueue_on(conn, [Job("work")])
        (child,) = store.enqueue_many([Job("child", after=[parent.id])])
        conn.rollback()
    Reaper(store, Every(timedelta(seconds=5))).run_once()
    assert fetch(pg, child.id) == ("waiting", 1, None)
    pg.execute(
        "UPDATE job SET created_at = now() - %s - interval '1 second' WHERE id = %s",
        (MISSING_PARENT_GRACE, child.id),
    )
    Reaper(store, Every(timedelta(seconds=5))).run_once()
    assert fetch(pg, child.id) == ("canceled", 0, f"canceled: parent {parent.id} does not exist")


def test_retry_of_a_failed_parent_makes_its_children_wait_for_it_again(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    parent = add(store)
    cancels = add(store, "child", after=[parent])
    runs = add(store, "child", after=[parent], if_parent_fails="run")
    (ticket,) = take_all(store).values()
    store.settle(ticket, dead_outcome())
    assert fetch(pg, cancels)[0] == "canceled" and fetch(pg, runs)[0] == "pending"
    admin = PostgresAdmin(dsn)
    try:
        # Retrying a child whose parent is still dead: it runs (the operator asked for it).
        # Retrying the parent first makes its children wait for it again.
        assert admin.retry(JobFilter(ids=(parent,), state=State.DEAD)) == [parent]
        assert fetch(pg, parent)[0] == "pending"
        assert fetch(pg, runs)[:2] == ("waiting", 1)  # it had not started: it waits again
        assert fetch(pg, cancels)[:2] == ("canceled", 1)  # a verdict stays
        assert admin.retry(JobFilter(ids=(cancels,), state=State.CANCELED)) == [cancels]
        assert fetch(pg, cancels)[:2] == ("waiting", 1)
    finally:
        admin.close()
    (ticket,) = take_all(store).values()
    assert store.settle(ticket, DONE)
    assert fetch(pg, cancels)[:2] == ("pending", 0) and fetch(pg, runs)[:2] == ("pending", 0)


def test_retry_of_a_job_the_reaper_killed_resets_its_expiries(
    pg: psycopg.Connection[Any], store: PostgresStore, dsn: str
) -> None:
    job = add(store)
    for _ in range(2):
        take_all(store)
        pg.execute("UPDATE job SET locked_until = now() - interval '1 second'")
        store.requeue_expired(max_expirations=2)
    assert fetch(pg, job)[0] == "dead"
    admin = PostgresAdmin(dsn)
    try:
        assert admin.retry(JobFilter(ids=(job,), state=State.DEAD)) == [job]
    finally:
        admin.close()
    row = pg.execute(
        "SELECT state, attempts, expirations, expiry_streak FROM job WHERE id = %s", (job,)
    ).fetchone()
    assert row == ("pending", 0, 0, 0)


def test_cancel_workflow_tells_only_the_running_jobs_supervisors(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    wf = Workflow()
    a = wf.add(Job("work"))
    wf.add(Job("work"), after=[a])
    wf.add(Job("work"))
    store.enqueue_workflow(wf)
    running = store.claim("w1", ["work"], LEASE)
    assert running is not None
    listener, heard = notifications(dsn, "brooq_cancel")
    assert store.cancel_workflow(wf.id) == 3
    assert drain_notifies(listener, heard) == [running.id]
    listener.close()


def test_a_workflow_in_a_transaction_that_rolls_back_leaves_nothing(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    wf = Workflow()
    a = wf.add(Job("work"))
    wf.add(Job("work"), after=[a])
    with psycopg.connect(dsn) as conn:
        store.enqueue_workflow(wf, conn)
        conn.rollback()
    assert pg.execute("SELECT count(*) FROM job").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM job_edge").fetchone() == (0,)
    assert [e.state for e in store.enqueue_workflow(wf)] == [State.PENDING, State.WAITING]


def test_rolling_back_0012_is_refused_while_jobs_wait(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    parent = add(store)
    child = add(store, "child", after=[parent])
    later = [m.id for m in migrations.every_migration() if m.id > "0012.job-workflows"]
    assert migrations.down(dsn, steps=len(later)) == later[::-1]  # the ones after 0012 first
    with pytest.raises(Exception, match="waiting for their parents"):
        migrations.down(dsn, steps=1)
    assert fetch(pg, child)[0] == "waiting"
    pg.execute("DELETE FROM job")
    assert migrations.down(dsn, steps=1) == ["0012.job-workflows"]
    assert migrations.up(dsn) == ["0012.job-workflows", *later]


def test_a_partition_drop_keeps_waiting_rows_and_parents_their_children_may_read(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    """Retention by partition drop: a partition holding a waiting job, or a parent whose
    child has not ended, stays (a drop never resolves an edge by removing its parent);
    once the child ended the partition goes, with its rows' edges as children."""
    days = past_layout(pg, 10)
    ttl = timedelta(days=3)
    old = midnight(datetime.now(UTC)) - 9 * DAY + timedelta(hours=1)
    (parent,) = insert_rows(pg, old, ["done"])  # days[1]: a parent, its child not ended
    (waiting,) = insert_rows(pg, old + DAY, ["waiting"])  # days[2]: a waiting job
    (other,) = insert_rows(pg, old + 2 * DAY, ["done"])  # days[3]: the waiting job's parent
    (child,) = insert_rows(pg, old + 3 * DAY, ["pending"])  # days[4]: the parent's child
    pg.execute(
        "UPDATE job SET if_parent_fails = 'cancel', parents_left = 1 WHERE id = %s", (waiting,)
    )
    pg.execute(
        "INSERT INTO job_edge (parent_id, child_id, parent_state) VALUES "
        "(%s, %s, 'done'), (%s, %s, NULL)",
        (parent, child, other, waiting),
    )
    dropped = {d.name for d in pg_store.drop_partitions(ttl, 20)}
    assert dropped == {"job_initial", days[0], days[5], days[6]}
    for name in days[1:4]:  # nor when asked by name
        row = pg.execute("SELECT brooq_job_drop_partition(%s, %s)", (name, ttl)).fetchone()
        assert row == (None,), name
    assert pg_store.parents(child) == {parent: Parent(State.DONE)}
    # The child ends, the waiting job is canceled: every partition may go, edges with them.
    pg.execute("UPDATE job SET state = 'done' WHERE id = %s", (child,))
    assert pg_store.cancel(waiting)
    pg.execute(
        "UPDATE job SET updated_at = updated_at - interval '30 days' WHERE id = ANY(%s::uuid[])",
        ([child, waiting],),
    )
    dropped = {d.name for d in pg_store.drop_partitions(ttl, 20)}
    assert dropped == {days[1], days[2], days[3], days[4]}
    assert pg.execute("SELECT count(*) FROM job_edge").fetchone() == (0,)
