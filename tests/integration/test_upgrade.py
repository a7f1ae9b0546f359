"""`brooq migrate up` partitions an existing job table in place, and `migrate down` undoes it.

A million rows in every state, a quarter of them keyed, with attempts, expirations and
leases, go through 0009 and back: every row, key, attempt count and lease stays as it
was. The seconds it takes are printed (docs/operations.md, "Upgrading").
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from brooq.postgres import migrations
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job, State

pytestmark = pytest.mark.db

ROWS = 1_000_000

FILL = """
INSERT INTO job (id, topic, payload, state, attempts, expirations, expiry_streak, available_at,
                 locked_by, locked_until, idempotency_key, last_error, created_at, updated_at,
                 priority)
SELECT brooq_uuid7(), 'topic.' || (i % 7), jsonb_build_object('i', i),
       (ARRAY['pending', 'processing', 'done', 'failed', 'dead', 'canceled',
              'done', 'done', 'done', 'done'])[1 + i % 10],
       2 + i % 3, 1, 0, now() - make_interval(secs => i),
       CASE WHEN i % 10 = 1 THEN 'host:' || (i % 13) || ':abc' END,
       CASE WHEN i % 10 = 1 THEN now() + make_interval(secs => i % 600) END,
       CASE WHEN i % 4 = 0 THEN 'key-' || i END,
       CASE WHEN i % 10 IN (3, 4) THEN 'RuntimeError: ' || i END,
       now() - make_interval(secs => i), now() - make_interval(secs => i / 2), i % 3
FROM generate_series(1, %s) AS i
"""

# Rows whose ids were not made by brooq and lie past every created range: the default.
ODD = (
    "INSERT INTO job (id, topic, idempotency_key) "
    "VALUES ('ffffffff-0000-4000-8000-000000000001', 'odd', 'odd-1')"
)

COLUMNS_0008 = (
    "id, topic, payload, state, attempts, available_at, locked_by, locked_until, "
    "idempotency_key, last_error, created_at, updated_at, priority, expirations, "
    "last_traceback, expiry_streak"
)
"""The columns a job had before 0009: what later migrations add is not the old row's."""
FINGERPRINT = (
    "SELECT count(*), sum(('x' || left(md5(ROW(" + COLUMNS_0008 + ")::text), 15))"
    "::bit(60)::bigint), count(idempotency_key), sum(attempts), count(locked_until) FROM job j"
)


def _fingerprint(pg: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = pg.execute(FINGERPRINT).fetchone()
    assert row is not None
    return tuple(row)


def test_the_migration_stays_plain_sql_for_alembic_and_django() -> None:
    """No %, and no colon before a word (SQLAlchemy's text() would take it for a
    parameter), outside comments; see docs/integrations.md."""
    for m in migrations.every_migration():
        for text in (m.sql, m.rollback_sql):
            code = "\n".join(line.split("--")[0] for line in text.splitlines())
            assert "%" not in code, m.id
            assert not re.search(r"(?<![:\w]):\w", code), m.id


AFTER_0009 = [m for m in migrations.migration_ids() if m > "0009.job-partitions"]
"""The migrations after 0009 (adding columns: no copy), applied and rolled back with it."""


@pytest.mark.timeout(120)
def test_upgrade_in_place_and_back_with_a_million_rows(empty_dsn: str) -> None:
    migrations.up(empty_dsn)
    # Back to before 0009 (what came after it rolls back first), as an old database is.
    assert migrations.down(empty_dsn, steps=len(AFTER_0009) + 1) == [
        *reversed(AFTER_0009),
        "0009.job-partitions",
    ]
    with psycopg.connect(empty_dsn, autocommit=True) as pg:
        pg.execute(FILL.replace("%", "%%").replace("%%s", "%s"), (ROWS,))
        pg.execute(ODD)
        pg.execute("ANALYZE job")
        before = _fingerprint(pg)
        keyed = pg.execute("SELECT count(*) FROM job WHERE idempotency_key IS NOT NULL").fetchone()

    started = time.monotonic()
    assert migrations.up(empty_dsn) == ["0009.job-partitions", *AFTER_0009]
    up_s = time.monotonic() - started

    with psycopg.connect(empty_dsn, autocommit=True) as pg:
        assert _fingerprint(pg) == before
        assert pg.execute("SELECT count(*) FROM job_key").fetchone() == keyed
        # Each key points at the row that holds it.
        assert (
            pg.execute(
                "SELECT count(*) FROM job_key k JOIN job ON job.id = k.job_id "
                "AND job.topic = k.topic AND job.idempotency_key = k.idempotency_key"
            ).fetchone()
            == keyed
        )
        where: dict[str, int] = dict(
            pg.execute("SELECT tableoid::regclass::text, count(*) FROM job GROUP BY 1")
        )
        assert where == {"job_initial": ROWS, "job_default": 1}
        assert pg.execute("SELECT relkind FROM pg_class WHERE relname = 'job'").fetchone() == ("p",)

    store = PostgresStore(empty_dsn)
    try:
        # A key of the old table still holds its job, in its state.
        (again,) = store.enqueue_many([Job("topic.0", idempotency_key="key-1008")])
        assert not again.created and again.state is State.DONE  # i = 1008: topic.0, done
        (odd,) = store.enqueue_many([Job("odd", idempotency_key="odd-1")])
        assert (odd.id, odd.created) == ("ffffffff-0000-4000-8000-000000000001", False)
        claimed = store.claim("w", ["topic.0"], timedelta(seconds=30))
        assert claimed is not None and claimed.attempt >= 1
        row = store.get(claimed.id)
        assert row.state is State.PROCESSING and row.locked_by == "w"
    finally:
        store.close()
    with psycopg.connect(empty_dsn, autocommit=True) as pg:
        before = _fingerprint(pg)  # with the claim

    started = time.monotonic()
    assert migrations.down(empty_dsn, steps=len(AFTER_0009) + 1) == [
        *reversed(AFTER_0009),
        "0009.job-partitions",
    ]
    down_s = time.monotonic() - started
    with psycopg.connect(empty_dsn, autocommit=True) as pg:
        assert _fingerprint(pg) == before
        assert pg.execute("SELECT relkind FROM pg_class WHERE relname = 'job'").fetchone() == ("r",)
        assert pg.execute("SELECT to_regclass('job_idempotency_idx') IS NOT NULL").fetchone() == (
            True,
        )
    print(f"\n0009 with {ROWS:,} rows: up {up_s:.1f}s, down {down_s:.1f}s")
