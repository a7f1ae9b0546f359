"""The database side of the HTTP surface: the scrape-time gauges are bounded in time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from brooq.metrics import DatabaseCollector
from brooq.postgres.inspection import PostgresInspection
from brooq.vocabulary import StoreUnavailable

pytestmark = pytest.mark.db


@pytest.fixture
def inspection(dsn: str) -> Iterator[PostgresInspection]:
    """Operators' reads on a fresh database, each bounded to 200 ms."""
    reads = PostgresInspection(dsn, timeout=timedelta(milliseconds=200))
    yield reads
    reads.close()


def test_the_gauges_read_depth_and_the_oldest_ready_age(
    pg: psycopg.Connection[Any], inspection: PostgresInspection
) -> None:
    pg.execute(
        "INSERT INTO job (topic, payload, available_at) VALUES "
        "('a', 'null', now() - interval '5 seconds'), ('a', 'null', now()), "
        "('b', 'null', now() + interval '1 hour')"
    )
    depth = {(r.topic, r.state): r.jobs for r in inspection.depth()}
    assert depth == {("a", "pending"): 2, ("b", "pending"): 1}
    oldest = inspection.oldest_ready()
    assert set(oldest) == {"a"} and 5 <= oldest["a"] < 60


def test_the_reads_give_up_at_their_statement_timeout(
    dsn: str, inspection: PostgresInspection
) -> None:
    """A table nobody can read right now (locked here; huge in production) fails fast."""
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="statement timeout"):
            inspection.depth()
        assert time.monotonic() - started < 1.0
        locker.rollback()
    # The timeout was local to that transaction: the connection serves on, unbounded.
    assert inspection.depth() == []
    with inspection.connector.connection() as conn:
        row = conn.execute("SHOW statement_timeout").fetchone()
    assert row is not None and row[0] == "0"


def test_a_scrape_during_a_timeout_has_no_database_gauges(
    dsn: str, inspection: PostgresInspection
) -> None:
    collector = DatabaseCollector(inspection, ["a"])
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
        assert list(collector.collect()) == []
        locker.rollback()
    assert [f.name for f in collector.collect()] == [
        "brooq_jobs",
        "brooq_ready_oldest_age_seconds",
        "brooq_rate_tokens",
        "brooq_rate_keys_waiting",
        "brooq_topic_paused",
        "brooq_jobs_waiting_by_version",
    ]
