"""Fair claiming with a real supervisor (issue 34): 20,000 jobs of tenant A, then 20 of B,
4 workers. On a fair topic every B job starts before A's 20,000th does; on a plain topic
(FIFO) they start after. Each job's result is the time its handler started."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job
from tests.system.harness import count, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

ARGS = ("--workers", "4", "--http-addr", "127.0.0.1:0", "--poll-interval", "200ms")
BIG, SMALL = 20_000, 20


def enqueue(dsn: str, topic: str) -> None:
    """BIG jobs of key a, then SMALL of key b, each batch in one enqueue (COPY)."""
    store = PostgresStore(dsn)
    try:
        store.enqueue_many([Job(topic, {"i": i}, rate_key="a") for i in range(BIG)])
        store.enqueue_many([Job(topic, {"i": i}, rate_key="b") for i in range(SMALL)])
    finally:
        store.close()


def starts(pg: psycopg.Connection[Any], topic: str, key: str) -> list[float]:
    rows = pg.execute(
        "SELECT (result #>> '{}')::float8 FROM job WHERE topic = %s AND rate_key = %s ORDER BY 1",
        (topic, key),
    ).fetchall()
    return [r[0] for r in rows]


def run(dsn: str, pg: psycopg.Connection[Any], topic: str) -> tuple[list[float], list[float]]:
    enqueue(dsn, topic)
    wait_until(
        lambda: count(pg, "topic = %s AND state = 'done'", (topic,)) == BIG + SMALL,
        150,
        f"{topic} drained",
        interval=0.5,
    )
    assert count(pg, "topic = %s AND attempts <> 1", (topic,)) == 0
    return starts(pg, topic, "a"), starts(pg, topic, "b")


@pytest.mark.timeout(400)
def test_a_small_tenant_does_not_wait_behind_a_big_one_on_a_fair_topic_only(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise(*ARGS, app="sysapp_fair:queue", name="fair")
    sup.wait_children(4, timeout=30)

    a, b = run(dsn, pg, "fair.work")
    assert len(a) == BIG and len(b) == SMALL
    assert max(b) < a[-1], "a B job started after A's 20,000th on the fair topic"
    # Keys in turn: B's 20 jobs start among the first few dozen, not behind A's backlog.
    behind = sum(1 for t in a if t < max(b))
    assert behind < 500, f"{behind} A jobs started before B's last one"

    a, b = run(dsn, pg, "plain.work")
    # FIFO: B waits behind A's backlog (the last A jobs and the first B ones share the last
    # claims and the workers' queues, and 4 workers start them in any order): fewer than 1%
    # of A's jobs start after B's first.
    after = sum(1 for t in a if t > min(b))
    assert after < BIG // 100, f"without fairness, {after} A jobs started after B's first"
    assert sup.stop() == 0
