"""The in-memory store's partitions: ranges of creation time, made ahead and dropped whole
like PostgreSQL's, so retention over the fake behaves as over the database."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from brooq.engine.fake import InMemoryStore
from brooq.engine.partitions import PartitionUpkeep
from brooq.engine.retention import Retention
from brooq.engine.store import DroppedPartition
from brooq.engine.timer import Every
from brooq.vocabulary import Job, State
from tests.conftest import Clock

DAY = timedelta(days=1)
TTL = timedelta(days=3)


def _settle_all(store: InMemoryStore, clock: Clock) -> None:
    for job_id, row in list(store.rows.items()):
        store.rows[job_id] = replace(row, state=State.DONE, updated_at=clock())


def test_ranges_are_made_ahead_from_the_newest(clock: Clock) -> None:
    store = InMemoryStore(clock)
    assert store.partitions == [("job_initial", None, datetime(2026, 1, 2, tzinfo=UTC))]
    upkeep = PartitionUpkeep(store, DAY)
    assert upkeep.run_once() == ["job_p20260102_000000", "job_p20260103_000000"]
    assert upkeep.run_once() == []
    clock.advance(30 * DAY)  # a month without upkeep: one range up to now's day
    made = upkeep.run_once()
    assert made[0] == "job_p20260104_000000"
    assert store.partitions[3][2] == datetime(2026, 1, 31, tzinfo=UTC)  # now: the next follows
    assert made[1] == "job_p20260131_000000"
    with pytest.raises(ValueError, match="1 hour"):
        store.add_partitions(timedelta(minutes=30), DAY, 1)


def test_retention_drops_whole_ranges_and_frees_their_keys(clock: Clock) -> None:
    store = InMemoryStore(clock)
    PartitionUpkeep(store, DAY).run_once()
    (old,) = store.enqueue_many([Job("work", idempotency_key="k")])
    _settle_all(store, clock)
    clock.advance(2 * DAY)
    (live,) = store.enqueue_many([Job("work", idempotency_key="live")])  # in a later range
    clock.advance(5 * DAY)
    retention = Retention(store, TTL, 100, Every(timedelta(hours=1)))
    assert retention.run_once() == []  # nothing row by row: the range went whole
    # Every range that ended more than the TTL ago goes, the empty one too.
    assert retention.dropped == [
        DroppedPartition("job_initial", 1),
        DroppedPartition("job_p20260102_000000", 0),
    ]
    (again,) = store.enqueue_many([Job("work", idempotency_key="k")])
    assert again.created and again.id != old.id
    # The range holding a pending job waits, whatever its age.
    assert store.get(live.id).state is State.PENDING
    clock.advance(30 * DAY)
    assert store.drop_partitions(TTL, 10) == []
    assert [n for n, _, _ in store.partitions] == ["job_p20260103_000000"]
