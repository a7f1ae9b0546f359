"""The claim of a topic with a limit: max_running, a rate limit, fairness, or several.

Each topic is claimed in a transaction of its own that first takes the
topic's claim lock (``lock_topic``), so the count of running jobs and the
rate limit's buckets it reads include every claim committed before it, on
every host. The rate limit is read and spent with the database's clock, in
that same transaction.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from brooq.engine.rotation import Cursor, Turn, turns
from brooq.engine.store import Claimed
from brooq.postgres.connect import Connector
from brooq.postgres.rows import claimed_rows
from brooq.postgres.sql import sql
from brooq.vocabulary import Fairness, RateLimit
from brooq.vocabulary.fairness import MAX_WEIGHT

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
    token again. A fair topic takes its keys in turn (:func:`claim_fair`).
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
    assert fairness is not None or max_running is not None
    with connector.connection() as conn, conn.transaction():
        if fairness is not None:
            conn.execute(sql("lock_fair_topic"), {"topic": topic})
            return claimed_rows(claim_fair(conn, params, fairness), holder), None
        conn.execute(sql("lock_topic"), {"topic": topic})
        return claimed_rows(conn.execute(sql("claim_topic_limited"), params), holder), None


def fair_params(fairness: Fairness | None) -> dict[str, Any]:
    """The parameters a fair claim takes (a claim that is not fair ignores its turns)."""
    return {
        "fair": fairness is not None,
        "fair_keys": fairness.keys if fairness else [],
        "fair_weights": fairness.counts if fairness else [],
        "unkeyed_window": UNKEYED_WINDOW,
        "most_weight": MAX_WEIGHT,
    }


Row = tuple[Any, ...]


def claim_fair(
    conn: psycopg.Connection[Any], params: dict[str, Any], fairness: Fairness
) -> list[Row]:
    """Up to ``params["limit"]`` jobs of a fair topic in its keys' turns, after lock_fair_topic
    in ``conn``'s transaction: the claimed rows (``claimed_columns``).

    Priority by priority: ``fair_walk`` reads the keys after the cursor at the highest ready
    priority, this chooses by the turns (brooq.engine.rotation), ``claim_fair_turns`` claims
    and moves the cursor; a priority that ran out leaves the rest to the next one."""
    out: list[Row] = []
    limit = params["limit"]
    while len(out) < limit:
        asked = {**params, "limit": limit - len(out)}
        walked = conn.execute(sql("fair_walk"), asked).fetchall()
        if not walked:
            break
        chosen = FairRead(walked, fairness, asked["limit"]).complete(conn, asked).chosen()
        rows = conn.execute(sql("claim_fair_turns"), {**asked, **chosen_params(chosen)})
        got = rows.fetchall()
        out.extend(got)
        if len(got) < len(chosen) or len(chosen) >= asked["limit"]:
            break  # max_running's room, a row locked by someone else, or all taken
    return out


def chosen_params(chosen: Sequence[tuple[Any, Turn]]) -> dict[str, Any]:
    """claim_fair_turns' parameters: the chosen rows in turn order with their turns."""
    return {
        "ids": [i for i, _ in chosen],
        "keys": [t.key for _, t in chosen],
        "rounds": [t.round for _, t in chosen],
        "bases": [t.base for _, t in chosen],
    }


class FairRead:
    """The rows one priority of a fair claim read (fair_walk, then fair_more), by key."""

    def __init__(self, walked: Sequence[Row], fairness: Fairness, limit: int) -> None:
        first = walked[0]
        self.priority: int = first[5]
        self.cursor = Cursor(first[6], first[7])
        self.whole = first[8] < limit
        """Whether the walk went round every key (else it stopped at ``limit`` keys)."""
        self.fairness, self.limit = fairness, limit
        self.order: list[str] = []
        self.asked: dict[str, int] = {}
        self.rows: dict[str, list[Any]] = {}
        for key, _idx, asked, _place, job_id, *_ in sorted(walked, key=lambda r: (r[1], r[3])):
            if key not in self.asked:
                self.order.append(key)
                self.asked[key], self.rows[key] = asked, []
            self.rows[key].append(job_id)

    def complete(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> FairRead:
        """Read more rounds of the keys that gave all they were asked while the rows read
        fall short of the claim: then every row of the rounds read is known, and the first
        ``limit`` of the turns are among them (docs/architecture.md, "Fair claiming")."""
        while self.whole and sum(map(len, self.rows.values())) < self.limit:
            full = [k for k in self.order if len(self.rows[k]) >= self.asked[k]]
            if not full:
                break
            short = self.limit - sum(map(len, self.rows.values()))
            rounds = math.ceil(short / sum(self.fairness.weight(k or None) for k in full))
            takes = [min(self.limit, rounds * self.fairness.weight(k or None)) for k in full]
            more = {"keys": full, "skips": [self.asked[k] for k in full], "takes": takes}
            read = conn.execute(sql("fair_more"), {**params, **more, "priority": self.priority})
            for key, _place, job_id in sorted(read.fetchall(), key=lambda r: (r[0], r[1])):
                self.rows[key].append(job_id)
            for key, take in zip(full, takes, strict=True):
                self.asked[key] += take
        return self

    def chosen(self) -> list[tuple[Any, Turn]]:
        """The first ``limit`` rows read, in the order of the turns."""
        return turns(self.order, self.rows, self.cursor, self.fairness)[: self.limit]


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
