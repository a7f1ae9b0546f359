"""The claim of a topic with a limit: max_running, a rate limit, fairness, or several.

Each topic is claimed in a transaction of its own that first takes the
topic's claim lock (``lock_topic``), so the count of running jobs and the
rate limit's buckets it reads include every claim committed before it, on
every host. The rate limit is read and spent with the database's clock, in
that same transaction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from brooq.engine.store import Claimed
from brooq.postgres.connect import Connector
from brooq.postgres.rows import claimed_rows
from brooq.postgres.sql import sql
from brooq.vocabulary import Fairness, RateLimit

DEADLOCK_RETRIES = 5
KEYS_PER_CLAIM = 128
"""The most keys (rate_key) one claim of a keyed, rate-limited topic visits: its cost stays
that of 128 short index probes however many keys have ready jobs; the next claim goes on
where this one stopped, so every key gets its turn."""
UNKEYED_LOOK_S = 1.0
"""A rate-limited topic whose last claim found no job without a key looks for one again
after this long (the look passes over every keyed job of the topic): a job enqueued
without a key into a topic of keyed jobs waits up to this much longer."""
UNKEYED_WINDOW = 1000
"""A fair claim looks for jobs without a key among the topic's first this many ready rows
(claim order): a fair topic whose jobs all have keys is never read whole for none."""


@dataclass
class KeyWalk:
    """What the claims of one keyed, rate-limited topic remember between claims."""

    after: str = ""
    """The key after which the next walk over the keys starts ('': the first)."""
    unkeyed_at: float = 0.0
    """Look for jobs without a key from this time on (monotonic)."""


def claim_limited(
    connector: Connector,
    holder: str,
    topic: str,
    lease: timedelta,
    limit: int,
    max_running: int | None,
    rate: RateLimit | None,
    app_version: str | None = None,
    fairness: Fairness | None = None,
    walks: dict[str, KeyWalk] | None = None,
) -> tuple[list[Claimed], float | None]:
    """Up to ``limit`` jobs of ``topic`` (of ``app_version`` or none) within its limits; and,
    when the rate limit cut the claim short, the seconds until a key that waits for it has a
    token again. A fair topic takes its keys in turn (queries.sql ``claim_topic_fair``).
    ``walks`` keeps, per rate-limited topic, where the next claim's walk over keys starts."""
    params: dict[str, Any] = {
        **fair_params(fairness),
        "holder": holder,
        "lease": lease,
        "topic": topic,
        "limit": limit,
        "max_running": max_running,
        "app_version": app_version,
    }
    if rate is not None:
        walk = (walks if walks is not None else {}).setdefault(topic, KeyWalk())
        return _claim_rated(connector, holder, params, rate, walk)
    # A fair topic, or a capped one (max_running), after the topic's claim lock.
    statement = "claim_topic_fair" if fairness is not None else "claim_topic_limited"
    assert fairness is not None or max_running is not None
    with connector.connection() as conn, conn.transaction():
        conn.execute(sql("lock_topic"), {"topic": topic})
        return claimed_rows(conn.execute(sql(statement), params), holder), None


def fair_params(fairness: Fairness | None) -> dict[str, Any]:
    """The parameters a fair claim takes (a claim that is not fair ignores its turns)."""
    return {
        "fair": fairness is not None,
        "fair_keys": fairness.keys if fairness else [],
        "fair_weights": fairness.counts if fairness else [],
        "unkeyed_window": UNKEYED_WINDOW,
    }


def _claim_rated(
    connector: Connector, holder: str, given: dict[str, Any], rate: RateLimit, walk: KeyWalk
) -> tuple[list[Claimed], float | None]:
    topic = given["topic"]
    params = {
        **given,
        "rate": rate.count,
        "per": rate.per,
        "per_us": rate.interval_us,
        "burst": rate.burst,
        "after": walk.after,
        "most": KEYS_PER_CLAIM,
        "unkeyed": time.monotonic() >= walk.unkeyed_at,
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
    wait, walk.after, found = rows[0][:3] if rows else (None, "", None)
    if found is not None:
        walk.unkeyed_at = 0.0 if found else time.monotonic() + UNKEYED_LOOK_S
    return claimed_rows((r[3:] for r in rows if r[3] is not None), holder), wait
