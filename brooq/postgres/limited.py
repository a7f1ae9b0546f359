"""The claim of a topic with a limit: max_running, a rate limit, or both.

Each topic is claimed in a transaction of its own that first takes the
topic's claim lock (``lock_topic``), so the count of running jobs and the
rate limit's buckets it reads include every claim committed before it, on
every host. The rate limit is read and spent with the database's clock, in
that same transaction.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg

from brooq.engine.store import Claimed
from brooq.postgres.connect import Connector
from brooq.postgres.rows import claimed_rows
from brooq.postgres.sql import sql
from brooq.vocabulary import RateLimit

DEADLOCK_RETRIES = 5


def claim_limited(
    connector: Connector,
    holder: str,
    topic: str,
    lease: timedelta,
    limit: int,
    max_running: int | None,
    rate: RateLimit | None,
    app_version: str | None = None,
) -> tuple[list[Claimed], float | None]:
    """Up to ``limit`` jobs of ``topic`` (of ``app_version`` or none) within its limits; and,
    when the rate limit cut the claim short, the seconds until a key that waits for it has a
    token again."""
    if rate is None:
        assert max_running is not None
        params: dict[str, Any] = {
            "holder": holder,
            "lease": lease,
            "topic": topic,
            "limit": limit,
            "max_running": max_running,
            "app_version": app_version,
        }
        with connector.connection() as conn, conn.transaction():
            conn.execute(sql("lock_topic"), {"topic": topic})
            return claimed_rows(conn.execute(sql("claim_topic_limited"), params), holder), None
    return _claim_rated(connector, holder, topic, lease, limit, max_running, rate, app_version)


def _claim_rated(
    connector: Connector,
    holder: str,
    topic: str,
    lease: timedelta,
    limit: int,
    max_running: int | None,
    rate: RateLimit,
    app_version: str | None,
) -> tuple[list[Claimed], float | None]:
    params = {
        "app_version": app_version,
        "holder": holder,
        "lease": lease,
        "topic": topic,
        "limit": limit,
        "max_running": max_running,
        "rate": rate.count,
        "per": rate.per,
        "per_us": rate.interval_us,
        "burst": rate.burst,
    }
    for attempt in range(DEADLOCK_RETRIES):
        try:
            with connector.connection() as conn, conn.transaction():
                conn.execute(sql("lock_topic"), {"topic": topic})
                rows = conn.execute(sql("claim_topic_rated"), params).fetchall()
            break
        except psycopg.errors.DeadlockDetected:
            # A release refunding a bucket this claim spends, in the other order: the
            # transaction rolled back whole, so trying again is safe.
            if attempt == DEADLOCK_RETRIES - 1:
                raise
            time.sleep(0.001 * (attempt + 1))
    wait = rows[0][9] if rows else None
    claimed = claimed_rows((r[:8] for r in rows if r[0] is not None), holder)
    return claimed, wait
