"""The database side of the HTTP surface: the scrape-time gauges are bounded in time."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from brooq.metrics import DatabaseCollector
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import StoreUnavailable

pytestmark = pytest.mark.db


def test_gauges_read_what_depth_and_oldest_ready_read(
        pg: psycopg.Connection[Any], pg_store: PostgresStore) -> None:
    pg.execute("INSERT INTO job (topic, payload, available_at) VALUES "
               "('a', 'null', now() - interval '5 seconds'), ('a', 'null', now()), "
               "('b', 'null', now() + interval '1 hour')")
    depth, oldest = pg_store.gauges(timedelta(milliseconds=500))
    assert depth == pg_store.depth()
    assert set(oldest) == {"a"} and 5 <= oldest["a"] < 60


def test_gauges_give_up_at_their_statement_timeout(
        dsn: str, pg_store: PostgresStore) -> None:
    """A table nobody can read right now (locked here; huge in production) fails fast."""
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="statement timeout"):
            pg_store.gauges(timedelta(milliseconds=200))
        assert time.monotonic() - started < 1.0
        locker.rollback()
    # The timeout was local to that transaction: the connection serves on, unbounded.
    assert pg_store.gauges(timedelta(milliseconds=500))[0] == []
    with pg_store.connector.connection() as conn:
        row = conn.execute("SHOW statement_timeout").fetchone()
    assert row is not None and row[0] == "0"


def test_a_scrape_during_a_timeout_has_no_database_gauges(
        dsn: str, pg_store: PostgresStore) -> None:
    collector = DatabaseCollector(lambda: pg_store.gauges(timedelta(milliseconds=200)), ["a"])
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
        assert list(collector.collect()) == []
        locker.rollback()
    assert [f.name for f in collector.collect()] == ["brooq_jobs",
                                                     "brooq_ready_oldest_age_seconds"]
