"""Claims from floors on a real PostgreSQL (brooq/postgres/floors.py, docs/architecture.md).

A store claims each priority level of a topic from where its last claim stopped, so what
it claimed before, and the row versions a held snapshot keeps of it, are never walked
again. What must still be found behind a floor is: a row whose enqueue committed after a
later claim, a row made ready in the past by hand, a row another claimer held when it
was passed (after a sweep), and a level that appeared since.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from brooq import Job
from brooq.postgres.floors import SWEEP_S, Floors
from brooq.postgres.sql import sql
from brooq.postgres.store import PostgresStore
from tests.integration.plans import Layout

pytestmark = pytest.mark.db

LEASE = timedelta(minutes=1)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(dsn: str, clock: Clock) -> Iterator[PostgresStore]:
    """A store whose floors sweep only when the test moves ``clock``."""
    store = PostgresStore(dsn)
    store._floors = {None: Floors(clock)}
    yield store
    store.close()


def _claim_ids(store: PostgresStore, limit: int = 10) -> list[str]:
    return [c.id for c in store.claim_many("w1", ["work"], LEASE, limit)]


@pytest.mark.parametrize("xid_first", [True, False], ids=["xid-before-claim", "xid-after"])
def test_a_row_whose_enqueue_commits_after_a_later_claim_is_claimed_next(
    dsn: str, store: PostgresStore, xid_first: bool
) -> None:
    """The enqueue's transaction began first (its row's available_at is earlier than every
    row the claim took), and committed after the claim moved the floor past them: the
    look finds it by its transaction, whether that transaction had its id before the
    claim's snapshot or took one after."""
    with psycopg.connect(dsn) as late:
        late.execute("SELECT pg_current_xact_id()" if xid_first else "SELECT now()")
        (early,) = store.enqueue_many([Job("work", {"n": 1})])
        assert _claim_ids(store) == [early.id]
        (behind,) = store.enqueue_many([Job("work", {"n": 2})], conn=late)
        assert _claim_ids(store) == [], "not committed yet"
        late.commit()
    assert _claim_ids(store) == [behind.id]


def test_a_row_made_ready_in_the_past_by_hand_is_claimed(
    pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    """An UPDATE that moves a scheduled row's available_at behind the floor (as `brooq jobs
    retry` or an operator does) stamps the row: the next look finds it."""
    (scheduled,) = store.enqueue_many(
        [Job("work", available_at=datetime.now(UTC) + timedelta(hours=1))]
    )
    (now,) = store.enqueue_many([Job("work")])
    assert _claim_ids(store) == [now.id]
    pg.execute("UPDATE job SET available_at = created_at WHERE id = %s", (scheduled.id,))
    assert _claim_ids(store) == [scheduled.id]


def test_a_row_passed_over_while_locked_is_claimed_after_a_sweep(
    dsn: str, store: PostgresStore, clock: Clock
) -> None:
    """SKIP LOCKED passes a row another session holds; the floor moves past it, and the
    next sweep goes back to it."""
    first, second = store.enqueue_many([Job("work", {"n": 1}), Job("work", {"n": 2})])
    with psycopg.connect(dsn) as other:
        other.execute("SELECT 1 FROM job WHERE id = %s FOR NO KEY UPDATE", (first.id,))
        assert _claim_ids(store) == [second.id]
        other.rollback()
    clock.now += SWEEP_S
    assert _claim_ids(store) == [first.id]


def test_a_level_that_appears_later_is_claimed_first(store: PostgresStore) -> None:
    (low,) = store.enqueue_many([Job("work", {"n": 1}, priority=-5)])
    assert _claim_ids(store, 1) == [low.id]
    later = store.enqueue_many([Job("work", {"n": 2}), Job("work", {"n": 3}, priority=9)])
    assert _claim_ids(store) == [later[1].id, later[0].id]


def _walked(conn: psycopg.Connection[Any], statement: str, params: dict[str, Any]) -> int:
    """Buffers the busiest partition's scan of job_claim_idx touches in a run of
    ``statement`` (EXPLAIN ANALYZE, rolled back): the walk to the claimed rows."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", params)
        plan = row.fetchone()
    assert plan is not None
    scans = Layout(conn).index_scans(plan[0][0]["Plan"], "job_claim_idx")
    return max(int(n["Shared Hit Blocks"]) + int(n["Shared Read Blocks"]) for n in scans)


def test_under_a_held_snapshot_a_claim_does_not_walk_what_was_claimed_before(
    dsn: str, pg: psycopg.Connection[Any], store: PostgresStore
) -> None:
    """While a REPEATABLE READ snapshot is held, no claimed row's old version can be
    removed, from the heap or from job_claim_idx. A claim from the start of the topic
    (claim_topic) walks all of them; a claim from floors reads about what it takes. (Buffers
    are counted once a page in a row, so the walk of 4,900 claimed rows is ~100.)"""
    with psycopg.connect(dsn, autocommit=True) as held:
        held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        held.execute("SELECT count(*) FROM job").fetchone()
        store.enqueue_many([Job("work", {"n": n}) for n in range(5_000)])
        for _ in range(49):
            assert len(_claim_ids(store, 100)) == 100
        params: dict[str, Any] = {"holder": "w2", "lease": LEASE, "limit": 10, "app_version": None}
        from_start = _walked(pg, sql("claim_topic"), {**params, "topic": "work"})
        assert store._floors is not None
        look = store._floors[None].look(["work"])
        from_floors = _walked(pg, sql("claim_floors"), {**params, **look})
        assert from_start > 50, f"the snapshot kept nothing in the claim's way: {from_start}"
        assert from_floors * 10 < from_start, f"from floors {from_floors}, from start {from_start}"
        assert len(_claim_ids(store, 100)) == 100, "and the floors still hold the 100 left"


@pytest.mark.parametrize("name", ["settle_many", "heartbeat", "release"])
def test_writes_about_held_jobs_read_them_by_id_when_few_are_running(
    pg: psycopg.Connection[Any], store: PostgresStore, name: str
) -> None:
    """With few rows processing (as the statistics of any queue say), a plan could read
    every processing row through job_processing_idx and hash them against the tickets:
    cheap on a quiet database, but under a held snapshot that index keeps an entry for
    every job settled since. The fenced writes join by the primary key instead."""
    store.enqueue_many([Job("work", {"n": n}) for n in range(2_000)])
    held = store.claim_many("w1", ["work"], LEASE, 3)
    pg.execute("ANALYZE job")
    ids = [c.id for c in held]
    outcomes = [
        {"id": i, "holder": "w1", "attempt": 1, "state": "done", "refund": 0, "retry_s": 0,
         "error": None, "traceback": None, "result": None}
        for i in ids
    ]  # fmt: skip
    params = {
        "ids": ids, "holders": ["w1"] * 3, "attempts": [1] * 3, "lease": LEASE,
        "outcomes": json.dumps(outcomes), "notify": False,
    }  # fmt: skip
    with pg.transaction(force_rollback=True):
        row = pg.execute(f"EXPLAIN (FORMAT JSON) {sql(name)}", params).fetchone()
    assert row is not None
    layout = Layout(pg)
    plan = row[0][0]["Plan"]
    assert layout.index_scans(plan, "job_pkey"), f"{name} does not join by id"
    assert not layout.index_scans(plan, "job_processing_idx"), f"{name} reads every held row"
