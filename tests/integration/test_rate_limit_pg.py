"""Rate limits on real PostgreSQL: exact under concurrent claimers, on the database's clock,
and a claim that stays index scans on a large queue.

The semantics both stores share are in test_contract.py; what needs real
connections racing each other, or the planner, is here.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from brooq.engine.outcome import DONE
from brooq.postgres.limited import KEYS_PER_CLAIM, UNKEYED_LOOK_S
from brooq.postgres.sql import sql
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job, RateLimit
from tests.integration.plans import Layout

pytestmark = pytest.mark.db

LEASE = timedelta(minutes=5)
RATE = RateLimit(50, timedelta(seconds=1), 10)


def _claimer(
    dsn: str,
    rates: dict[str, RateLimit],
    stop: threading.Event,
    claimed: list[tuple[str, str | None]],
    errors: list[str],
) -> None:
    store = PostgresStore(dsn)
    holder = f"hammer-{threading.get_ident()}"
    try:
        while not stop.is_set():
            batch = store.claim_many(holder, ["api"], LEASE, 5, None, rates)
            for c in batch:
                claimed.append((c.id, c.topic))
                if not store.settle(c.ticket, DONE):
                    errors.append(f"lost the lease of {c.id}")
            if not batch:
                time.sleep(0.002)
    except Exception as exc:  # reported to the test
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        store.close()


def _hammer(dsn: str, seconds: float) -> tuple[int, float]:
    """8 claimers on their own connections for ``seconds``; (jobs claimed, seconds taken)."""
    stop = threading.Event()
    claimed: list[tuple[str, str | None]] = []
    errors: list[str] = []
    threads = [
        threading.Thread(target=_claimer, args=(dsn, {"api": RATE}, stop, claimed, errors))
        for _ in range(8)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    took = time.monotonic() - started
    assert not errors, errors[:5]
    assert not any(t.is_alive() for t in threads)
    return len(claimed), took


@pytest.mark.timeout(60)
def test_concurrent_claimers_never_take_more_than_the_bucket_allows(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """8 threads claim as fast as they can for 3 s at 50/s, burst 10: the claims (all on the
    database's clock, inside the client's interval) never exceed 10 + 50 × elapsed, and
    reach most of it (the limit is not met by starving the topic)."""
    pg.execute(
        "INSERT INTO job (topic, payload) SELECT 'api', to_jsonb(i) FROM generate_series(1, 1000) i"
    )
    claimed, took = _hammer(dsn, 3.0)
    most = RATE.burst + RATE.per_second * took
    assert claimed <= most, f"{claimed} claims in {took:.2f}s: more than {most:.0f}"
    assert claimed >= 0.8 * RATE.per_second * 3.0, f"only {claimed} claims in {took:.2f}s"


@pytest.mark.timeout(60)
def test_per_key_buckets_hold_under_concurrent_claimers(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """Four keys at 50/s each, burst 10, claimed together by 8 threads for 2 s: each key's
    claims stay within its own bucket, and every key is served."""
    pg.execute(
        "INSERT INTO job (topic, payload, rate_key) "
        "SELECT 'api', to_jsonb(i), 'k' || (i % 4) FROM generate_series(1, 2000) i"
    )
    _, took = _hammer(dsn, 2.0)
    rows = pg.execute(
        "SELECT rate_key, count(*) FROM job WHERE state = 'done' GROUP BY rate_key"
    ).fetchall()
    per_key = dict(rows)
    assert sorted(per_key) == ["k0", "k1", "k2", "k3"]
    most = RATE.burst + RATE.per_second * took
    for key, n in per_key.items():
        assert n <= most, f"key {key}: {n} claims in {took:.2f}s"
        assert n >= 0.7 * RATE.per_second * 2.0, f"key {key} starved: {n}"


def test_a_restart_adds_no_token_the_bucket_lives_in_the_database(
    pg_store: PostgresStore, pg: psycopg.Connection[Any]
) -> None:
    """A claimer that starts again (a new store, a new connection) finds the bucket as the
    last claim left it, dated by the database's clock."""
    pg_store.enqueue_many([Job("api", i) for i in range(20)])
    rates = {"api": RateLimit(6, timedelta(minutes=1), 3)}
    assert len(pg_store.claim_many("h1", ["api"], LEASE, 10, None, rates)) == 3
    pg_store.close()
    again = PostgresStore(pg)
    assert again.claim_many("h2", ["api"], LEASE, 10, None, rates) == []
    row = pg.execute(
        "SELECT full_at > clock_timestamp() + interval '25 seconds' FROM brooq_rate_limit "
        "WHERE topic = 'api' AND key = ''"
    ).fetchone()
    assert row == (True,)


# -- the claim stays one index scan per key ------------------------------------------------------

ROWS = 100_000


@pytest.fixture
def big_keyed_queue(pg: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """100,000 ready rows of one topic, half without a key, half over 50 keys; analyzed."""
    pg.execute(
        "INSERT INTO job (topic, payload, priority, available_at, rate_key) "
        "SELECT 'api', jsonb_build_object('i', i), (i %% 10) - 2, "
        "       now() - make_interval(secs => i / 100.0), "
        "       CASE WHEN i %% 2 = 0 THEN 'tenant-' || (i %% 50) END "
        "FROM generate_series(1, %s) AS i",
        (ROWS,),
    )
    pg.execute("ANALYZE job")
    return pg


def test_the_rated_claim_uses_the_indexes_and_never_scans_the_table(
    big_keyed_queue: psycopg.Connection[Any],
) -> None:
    params = {
        "holder": "w1",
        "lease": LEASE,
        "topic": "api",
        "limit": 16,
        "max_running": 100,
        "app_version": None,
        "fair": True,  # the fair order reads the same rows
        "fair_keys": ["tenant-1"],
        "fair_weights": [3],
        "unkeyed_window": 1000,
        "most_weight": 1000,
        "rate": 100,
        "per": timedelta(seconds=1),
        "per_us": 1_000_000,
        "burst": 20,
        "after": "",
        "most": KEYS_PER_CLAIM,
        "unkeyed": True,
    }
    row = big_keyed_queue.execute(
        "EXPLAIN (FORMAT JSON) " + sql("claim_topic_rated"), params
    ).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    layout = Layout(big_keyed_queue)  # job is partitioned: each partition has its indexes
    assert not layout.full_scans(plan), layout.full_scans(plan)
    job_bitmaps = [
        n
        for n in _nodes(plan)
        if n["Node Type"] == "Bitmap Heap Scan" and n.get("Relation Name") in layout.filled
    ]
    assert not job_bitmaps, "a bitmap scan reads pages of job's partitions"
    assert layout.index_scans(plan, "job_claim_idx"), "no scan of job_claim_idx"
    assert layout.index_scans(plan, "job_rate_key_idx"), "no scan of job_rate_key_idx"
    assert big_keyed_queue.execute(
        "SELECT count(*) FROM job WHERE state = 'pending'"
    ).fetchone() == (ROWS,), "EXPLAIN must not have claimed anything"


def _nodes(plan: dict[str, Any]) -> Any:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _keyed_jobs(pg: psycopg.Connection[Any], topic: str, keys: int) -> None:
    """One pending job per key ``k000001``…, enqueued in key order."""
    pg.execute(
        "INSERT INTO job (topic, rate_key, available_at) "
        "SELECT %s, 'k' || lpad(n::text, 6, '0'), now() - interval '1 minute' + n * interval "
        "'1 microsecond' FROM generate_series(1, %s) AS n",
        (topic, keys),
    )
    pg.execute("ANALYZE job")


@pytest.mark.timeout(120)
def test_a_claim_visits_a_bounded_number_of_keys_however_many_have_jobs(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """Issue 32, item 4: 100,000 distinct keys made a claim walk every one of them (1.5 s) and
    stall every other topic. A claim now visits KEYS_PER_CLAIM keys and says where the next
    one goes on; the cost of a claim is that of the bounded walk, however many keys wait."""
    _keyed_jobs(pg, "api", 100_000)
    store = PostgresStore(dsn)
    try:
        rates = {"api": RateLimit(1000, timedelta(seconds=1), 1000)}
        took = []
        for _ in range(3):
            started = time.monotonic()
            batch = store.claim_many("w1", ["api"], LEASE, 10, None, rates)
            took.append(time.monotonic() - started)
            assert len(batch) == 10
        # Each walk stopped after KEYS_PER_CLAIM keys, the next one going on from there.
        assert store._walks["api"].after == f"k{3 * KEYS_PER_CLAIM:06d}"
        print(f"claims of 10 among 100,000 keys took {[round(t * 1000, 1) for t in took]} ms")
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_every_key_gets_its_turn_and_no_claim_comes_back_short(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    keys = 3 * KEYS_PER_CLAIM + 7  # the walk wraps around to the first keys
    _keyed_jobs(pg, "api", keys)
    store = PostgresStore(dsn)
    try:
        rates = {"api": RateLimit(10_000, timedelta(seconds=1), 10_000)}
        taken: list[str] = []
        while len(taken) < keys:
            batch = store.claim_many("w1", ["api"], LEASE, 50, None, rates)
            assert len(batch) == min(50, keys - len(taken)), len(taken)  # work-conserving
            taken += [c.id for c in batch]
        assert len(set(taken)) == keys
        assert store.claim_many("w1", ["api"], LEASE, 50, None, rates) == []
    finally:
        store.close()


def test_a_rated_claim_carries_the_job_s_own_options_and_trace_context(dsn: str) -> None:
    store = PostgresStore(dsn)
    try:
        context = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        store.enqueue_many([Job("api", max_attempts=20, trace_context=context)])
        (claimed,) = store.claim_many("w1", ["api"], LEASE, 5, None, {"api": RATE})
        assert claimed.overrides is not None and claimed.overrides.max_attempts == 20
        assert claimed.trace_context is not None and "traceparent" in claimed.trace_context
    finally:
        store.close()


def test_a_topic_of_keyed_jobs_looks_for_unkeyed_ones_once_a_second(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """Looking for jobs without a key passes over every keyed job of the topic: a claim that
    found none looks again only after UNKEYED_LOOK_S (1 s), so a job enqueued without a key
    into a topic of keyed jobs may start up to a second later, and no later."""
    _keyed_jobs(pg, "api", 5)
    store = PostgresStore(dsn)
    try:
        rates = {"api": RateLimit(1000, timedelta(seconds=1), 1000)}
        assert len(store.claim_many("w1", ["api"], LEASE, 1, None, rates)) == 1  # found none
        (early,) = store.enqueue_many([Job("api", available_at=_an_hour_ago())])
        (taken,) = store.claim_many("w1", ["api"], LEASE, 1, None, rates)
        assert taken.id != early.id  # not looked for yet, though first in claim order
        time.sleep(UNKEYED_LOOK_S + 0.05)
        (taken,) = store.claim_many("w1", ["api"], LEASE, 1, None, rates)
        assert taken.id == early.id
    finally:
        store.close()


def _an_hour_ago() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC) - timedelta(hours=1)
