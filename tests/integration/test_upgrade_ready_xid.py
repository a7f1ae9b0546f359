"""`brooq migrate up` adds 0017.ready-xid to a live queue in place, and `migrate down` undoes it.

A million rows at 0016: ready, scheduled, failed awaiting their retry, processing under a
lease, ended; and a workflow whose child waits. After the upgrade every row is as it was,
the claim from floors takes the ready rows of a topic in claim order (and nothing
scheduled, held or waiting), a lease is still honoured (its holder settles it), the
waiting child is released when its parent ends; then back down. The seconds each way are
printed (benchmarks/README.md quotes them per million rows).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from brooq.engine.outcome import DONE
from brooq.engine.store import Ticket
from brooq.postgres import migrations
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job, State

pytestmark = pytest.mark.db

ROWS = 1_000_000
LEASE = timedelta(minutes=5)

FILL = """
INSERT INTO job (topic, payload, state, attempts, available_at, locked_by, locked_until,
                 priority, created_at, updated_at)
SELECT 'topic.' || (i %% 5), jsonb_build_object('i', i),
       (ARRAY['pending', 'pending', 'failed', 'failed', 'processing',
              'done', 'done', 'done', 'dead', 'canceled'])[1 + i %% 10],
       CASE WHEN i %% 10 < 2 THEN 0 ELSE 1 END,
       CASE WHEN i %% 10 IN (1, 3) THEN now() + interval '1 hour'   -- scheduled, retry later
            ELSE now() - make_interval(secs => i %% 100000) END,
       CASE WHEN i %% 10 = 4 THEN 'host:1:abcd' END,
       CASE WHEN i %% 10 = 4 THEN now() + interval '10 minutes' END,
       i %% 3, now() - interval '1 day', now() - interval '1 day'
FROM generate_series(1, %s) AS i
"""

FINGERPRINT = (
    "SELECT count(*), sum(('x' || left(md5(ROW(id, topic, payload, state, attempts, "
    "available_at, locked_by, locked_until, priority)::text), 15))::bit(60)::bigint) FROM job"
)


def _one(pg: psycopg.Connection[Any], query: str) -> Any:
    row = pg.execute(query).fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else tuple(row)


@pytest.mark.timeout(300)
def test_ready_xid_goes_on_a_live_queue_and_comes_off_it(empty_dsn: str) -> None:
    migrations.up(empty_dsn)
    assert migrations.down(empty_dsn) == ["0017.ready-xid"]
    with psycopg.connect(empty_dsn, autocommit=True) as pg:
        pg.execute(FILL, (ROWS,))
    old = PostgresStore(empty_dsn)
    try:
        (parent,) = old.enqueue_many([Job("flow", {"step": 1})])
        (child,) = old.enqueue_many([Job("flow", {"step": 2}, after=[parent.id])])
    finally:
        old.close()
    with psycopg.connect(empty_dsn, autocommit=True) as pg:
        pg.execute("ANALYZE job")
        before = _one(pg, FINGERPRINT)
        expected = [
            str(r[0])
            for r in pg.execute(
                "SELECT id FROM job WHERE topic = 'topic.0' AND state IN ('pending', 'failed') "
                "AND available_at <= now() ORDER BY priority DESC, available_at, id LIMIT 50"
            )
        ]
        held = _one(pg, "SELECT id FROM job WHERE state = 'processing' LIMIT 1")

    started = time.monotonic()
    assert migrations.up(empty_dsn) == ["0017.ready-xid"]
    up_s = time.monotonic() - started

    store = PostgresStore(empty_dsn)
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as pg:
            assert _one(pg, FINGERPRINT) == before
        claimed = store.claim_many("w", ["topic.0"], LEASE, 50)
        assert [c.id for c in claimed] == expected, "the ready rows, in claim order"
        # The lease taken before the upgrade is its holder's: it settles, nobody else runs it.
        assert store.settle(Ticket(str(held), "host:1:abcd", 1), DONE)
        assert store.get(str(held)).state is State.DONE
        # The workflow: the parent runs, the waiting child is released and claimed.
        (got,) = store.claim_many("w", ["flow"], LEASE, 5)
        assert (got.id, store.get(child.id).state) == (parent.id, State.WAITING)
        assert store.settle(got.ticket, DONE)
        (released,) = store.claim_many("w", ["flow"], LEASE, 5)
        assert released.id == child.id
    finally:
        store.close()
    with psycopg.connect(empty_dsn, autocommit=True) as pg:
        after = _one(pg, FINGERPRINT)

    started = time.monotonic()
    assert migrations.down(empty_dsn) == ["0017.ready-xid"]
    down_s = time.monotonic() - started
    with psycopg.connect(empty_dsn, autocommit=True) as pg:
        assert _one(pg, FINGERPRINT) == after
        assert _one(pg, "SELECT count(*) FROM pg_attribute WHERE attname = 'ready_xid'") == 0
    print(f"\n0017 with {ROWS:,} rows: up {up_s:.2f}s, down {down_s:.2f}s")
