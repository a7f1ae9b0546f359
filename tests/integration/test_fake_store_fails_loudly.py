"""The in-memory store behaves like PostgreSQL where it can and refuses loudly where it cannot,
through the public Queue API: the README's ``on_succeeded`` example is ``done`` on both (the fake
records the statement), and ``enqueue(conn=…)`` / ``enqueue_async`` on the fake raise
``brooq.NeedsDatabase`` instead of ignoring the caller's transaction."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import brooq
from brooq.testing import Executed, InMemoryStore

UPDATE = "UPDATE orders SET paid = true WHERE id = %s"


def paid(claim: brooq.Claim) -> None:
    """The README's example: an effect written in the settle transaction."""
    claim.on_succeeded(lambda conn: conn.execute(UPDATE, (claim.payload["order"],)))


def test_the_readme_hook_is_done_on_both_stores(dsn: str, pg: psycopg.Connection[Any]) -> None:
    store = InMemoryStore()
    fake = brooq.Queue(store)
    fake.register("order.paid", paid)
    job_id = fake.enqueue(brooq.Job("order.paid", {"order": 42})).id
    assert fake.drain().outcomes == {"done": 1}  # was failed: AttributeError on execute
    assert fake.get(job_id).state is brooq.State.DONE
    assert store.executed == [Executed(UPDATE, (42,))]

    pg.execute("CREATE TABLE orders (id int PRIMARY KEY, paid bool NOT NULL DEFAULT false)")
    pg.execute("INSERT INTO orders (id) VALUES (42)")
    real = brooq.Queue(dsn)
    real.register("order.paid", paid)
    job_id = real.enqueue(brooq.Job("order.paid", {"order": 42})).id
    assert real.drain().outcomes == {"done": 1}
    assert real.get(job_id).state is brooq.State.DONE
    assert pg.execute("SELECT paid FROM orders WHERE id = 42").fetchone() == (True,)
    real.close()


def test_a_failing_hook_leaves_nothing_recorded() -> None:
    store = InMemoryStore()
    queue = brooq.Queue(store)

    def boom(conn: Any) -> None:
        raise ZeroDivisionError("hook failed")

    def broken(claim: brooq.Claim) -> None:
        claim.on_succeeded(lambda conn: conn.execute("INSERT INTO a VALUES (1)"))
        claim.on_succeeded(boom)

    queue.register("broken", broken, max_attempts=1)
    queue.enqueue(brooq.Job("broken", None))
    assert queue.drain().outcomes == {"dead": 1}
    assert store.executed == []  # rolled back, as a transaction would be


def test_enqueue_inside_a_transaction_needs_a_database(dsn: str) -> None:
    queue = brooq.Queue(InMemoryStore())
    with psycopg.connect(dsn) as conn, pytest.raises(brooq.NeedsDatabase, match="PostgreSQL"):
        queue.enqueue(brooq.Job("order.paid", {"order": 1}), conn=conn)
    assert issubclass(brooq.NeedsDatabase, brooq.BrooqError)

    async def enqueue_async() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            await queue.enqueue_async(brooq.Job("order.paid", {"order": 1}), conn=aconn)

    with pytest.raises(brooq.NeedsDatabase, match="enqueue_async"):
        asyncio.run(enqueue_async())
    assert queue.drain().total == 0  # nothing was enqueued behind the caller's back


def pays_and_reads_back(claim: brooq.Claim) -> None:
    """A hook that reads what its statement returned."""

    def mark_paid(conn: Any) -> None:
        row = conn.execute(
            "UPDATE orders SET paid = true WHERE id = %s RETURNING id", (claim.payload["order"],)
        ).fetchone()
        conn.execute("INSERT INTO receipts (order_id) VALUES (%s)", (row[0],))

    claim.on_succeeded(mark_paid)


def test_a_hook_that_reads_is_done_on_postgresql_and_refused_loudly_on_the_fake(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    # Issue 22, item 21: fetchone() gave None, so the hook failed with a TypeError of the
    # fake's making (the job went failed) where PostgreSQL had a row.
    fake = brooq.Queue(InMemoryStore())
    fake.register("order.paid", pays_and_reads_back)
    fake.enqueue(brooq.Job("order.paid", {"order": 7}))
    with pytest.raises(brooq.NeedsDatabase, match=r"settle hook .*mark_paid reads"):
        fake.drain()

    pg.execute("CREATE TABLE orders (id int PRIMARY KEY, paid bool NOT NULL DEFAULT false)")
    pg.execute("CREATE TABLE receipts (order_id int NOT NULL)")
    pg.execute("INSERT INTO orders (id) VALUES (7)")
    real = brooq.Queue(dsn)
    real.register("order.paid", pays_and_reads_back)
    real.enqueue(brooq.Job("order.paid", {"order": 7}))
    assert real.drain().outcomes == {"done": 1}
    assert pg.execute("SELECT order_id FROM receipts").fetchall() == [(7,)]
    real.close()
