"""job's partitions: created ahead, dropped whole with their keys once old and all terminal,
kept while they hold a live row; a drop waits for no lock for long."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from brooq.engine.partitions import PartitionUpkeep
from brooq.engine.retention import Retention
from brooq.engine.store import DroppedPartition
from brooq.engine.timer import Every
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job
from tests.integration.partitions import (
    DAY,
    insert_rows,
    keys,
    midnight,
    partition_of,
    partitions,
    past_layout,
    uuid_at,
)

pytestmark = pytest.mark.db

TTL = timedelta(days=3)


def test_new_rows_land_in_a_partition_made_ahead_never_in_the_default(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    (job,) = pg_store.enqueue_many([Job("work", idempotency_key="k")])
    assert partition_of(pg, job.id) not in (None, "job_default")
    # The migration made the days ahead: tomorrow's rows have their partition already.
    tomorrow = uuid_at(datetime.now(UTC) + DAY + timedelta(hours=1))
    pg.execute("INSERT INTO job (id, topic) VALUES (%s, 'work')", (tomorrow,))
    assert partition_of(pg, tomorrow) not in (None, "job_default")


def test_partitions_are_made_ahead_and_take_the_default_rows_of_their_range(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    later = datetime.now(UTC) + 6 * DAY
    (far,) = insert_rows(pg, later, ["pending"], keys=["far"])
    assert partition_of(pg, far) == "job_default"
    before = partitions(pg)
    upkeep = PartitionUpkeep(pg_store, DAY)
    made = upkeep.run_once()  # 3 intervals ahead: up to now + 3 days
    assert made == [] or set(made) == partitions(pg) - before
    assert partition_of(pg, far) == "job_default"  # 6 days ahead: not yet
    made = pg_store.add_partitions(DAY, 8 * DAY, 20)
    assert made and set(made) <= partitions(pg)
    assert partition_of(pg, far) == f"job_p{midnight(later):%Y%m%d}_000000"
    assert pg.execute("SELECT count(*) FROM job_default").fetchone() == (0,)
    assert keys(pg)[("work", "far")] == far
    again, *_ = pg_store.enqueue_many([Job("work", idempotency_key="far")])
    assert (again.id, again.created) == (far, False)
    assert pg_store.add_partitions(DAY, 8 * DAY, 20) == []  # nothing more to make


def test_a_step_under_an_hour_is_refused(pg_store: PostgresStore) -> None:
    with pytest.raises(psycopg.Error, match="at least 1 hour"):
        pg_store.add_partitions(timedelta(minutes=59), DAY, 1)


def test_an_old_all_terminal_partition_goes_whole_with_its_keys(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    days = past_layout(pg, 10)
    old = midnight(datetime.now(UTC)) - 9 * DAY + timedelta(hours=1)
    gone = insert_rows(pg, old, ["done", "dead", "canceled"], keys=["a", "b", None])
    kept = insert_rows(pg, datetime.now(UTC) - 2 * DAY, ["done", "done"], keys=["c", None])
    assert partition_of(pg, gone[0]) == days[1]

    dropped = {d.name for d in pg_store.drop_partitions(TTL, 20)}
    # Every partition that ended more than the TTL ago goes, empty ones too; no other.
    assert dropped == {"job_initial", *days[:7]}
    assert partitions(pg) == {"job_default", *days[7:]}
    assert [partition_of(pg, j) for j in gone] == [None, None, None]
    assert set(keys(pg)) == {("work", "c")}
    assert all(partition_of(pg, j) for j in kept)
    # The key is free again: a new job, in today's partition.
    (again,) = pg_store.enqueue_many([Job("work", idempotency_key="a")])
    assert again.created and again.id != gone[0]


@pytest.mark.parametrize("live", ["pending", "failed", "processing", "recently-settled"])
def test_a_partition_holding_a_live_row_waits(
    pg: psycopg.Connection[Any], pg_store: PostgresStore, live: str
) -> None:
    days = past_layout(pg, 10)
    old = midnight(datetime.now(UTC)) - 9 * DAY + timedelta(hours=1)
    terminal = insert_rows(pg, old, ["done", "dead"], keys=["t1", "t2"])
    state = "done" if live == "recently-settled" else live
    settled = datetime.now(UTC) - timedelta(hours=1) if live == "recently-settled" else None
    (alive,) = insert_rows(pg, old, [state], keys=["live"], settled=settled)

    dropped = {d.name for d in pg_store.drop_partitions(TTL, 20)}
    assert dropped == {"job_initial", days[0], *days[2:7]}
    assert days[1] in partitions(pg)
    # Nor does brooq_job_drop_partition take it when asked by name.
    row = pg.execute("SELECT brooq_job_drop_partition(%s, %s)", (days[1], TTL)).fetchone()
    assert row == (None,)
    # Its terminal rows older than the TTL and one interval go row by row, keys with them.
    retention = Retention(pg_store, TTL, 100, Every(timedelta(hours=1)))
    assert sum(n for _, n in retention.run_once()) == 2
    assert [partition_of(pg, j) for j in terminal] == [None, None]
    assert partition_of(pg, alive) == days[1]
    assert set(keys(pg)) == {("work", "live")}


def test_retention_drops_first_then_deletes_what_no_drop_takes(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    days = past_layout(pg, 10)
    start = midnight(datetime.now(UTC)) - 9 * DAY
    whole = insert_rows(pg, start + timedelta(hours=2), ["done"] * 3)
    blocked = insert_rows(pg, start + DAY + timedelta(hours=2), ["done", "pending"])
    recent = insert_rows(pg, datetime.now(UTC) - DAY, ["done"])  # within the TTL
    retention = Retention(pg_store, TTL, 100, Every(timedelta(hours=1)), max_drops=20)
    deleted = retention.run_once()
    # Oldest first; a partition never analyzed is estimated at 0 rows.
    assert retention.dropped[:3] == [
        DroppedPartition("job_initial", 0),
        DroppedPartition(days[0], 0),
        DroppedPartition(days[1], 0),
    ]
    assert days[2] not in {d.name for d in retention.dropped}
    assert [partition_of(pg, j) for j in whole] == [None] * 3
    assert deleted == [("work", 1)]  # the terminal row the pending one holds back
    assert [partition_of(pg, j) for j in blocked] == [None, days[2]]
    assert partition_of(pg, recent[0]) is not None


def test_ttl_zero_or_less_is_refused(pg_store: PostgresStore) -> None:
    for ttl in (timedelta(0), timedelta(seconds=-1)):
        with pytest.raises(ValueError, match="TTL"):
            pg_store.drop_partitions(ttl, 1)


def test_a_drop_waits_a_moment_for_a_busy_table_and_goes_once_it_is_free(
    dsn: str, pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    days = past_layout(pg, 10)
    insert_rows(pg, midnight(datetime.now(UTC)) - 9 * DAY + timedelta(hours=1), ["done"])
    with psycopg.connect(dsn) as reader:
        reader.execute("SELECT count(*) FROM job")  # its transaction holds a lock on job
        started = time.monotonic()
        assert pg_store.drop_partitions(TTL, 20) == []
        assert time.monotonic() - started < 5.0  # lock_timeout: 100ms a partition
        # A claim meanwhile is not held up by the drops that gave up.
        assert pg_store.claim("w", ["work"], timedelta(seconds=30)) is None
    assert days[1] in {d.name for d in pg_store.drop_partitions(TTL, 20)}


def test_one_host_at_a_time(dsn: str, pg: psycopg.Connection[Any], pg_store: PostgresStore) -> None:
    past_layout(pg, 10)
    insert_rows(pg, midnight(datetime.now(UTC)) - 9 * DAY + timedelta(hours=1), ["done"])
    with psycopg.connect(dsn) as other:
        other.execute("SELECT pg_advisory_xact_lock(hashtextextended('brooq.job_partitions', 0))")
        assert pg_store.drop_partitions(TTL, 20) == []
        assert pg_store.add_partitions(DAY, 30 * DAY, 5) == []
    assert len(pg_store.drop_partitions(TTL, 20)) == 8


def test_duplicates_raced_against_the_drop_of_their_partition(
    dsn: str, pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    """No key is ever accepted twice while its job exists, and each is free once it is gone.

    Four threads enqueue the keys of an old partition's jobs over and over while the
    partition is dropped. Before the drop commits every answer is the old job; after it,
    the first enqueue of a key creates one new job and every later one returns it.
    """
    days = past_layout(pg, 10)
    names = [f"k{i}" for i in range(40)]
    old_ids = insert_rows(
        pg, midnight(datetime.now(UTC)) - 9 * DAY + timedelta(hours=1), ["done"] * 40, keys=names
    )
    old = dict(zip(names, old_ids, strict=True))
    answers: list[tuple[str, str, bool]] = []
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[BaseException] = []

    def enqueuer(n: int) -> None:
        store = PostgresStore(dsn)
        try:
            i = n
            while not stop.is_set():
                key = names[i % len(names)]
                (result,) = store.enqueue_many([Job("work", idempotency_key=key)])
                with lock:
                    answers.append((key, result.id, result.created))
                i += 7
        except BaseException as exc:  # surfaced below
            failures.append(exc)
        finally:
            store.close()

    twice: list[tuple[str, int]] = []

    def observer() -> None:
        """Any one snapshot that shows two jobs of a key: accepted twice while it existed."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                twice.extend(
                    conn.execute(
                        "SELECT idempotency_key, count(*) FROM job "
                        "WHERE idempotency_key = ANY(%s) GROUP BY 1 HAVING count(*) > 1",
                        (names,),
                    ).fetchall()
                )
                time.sleep(0.002)

    threads = [threading.Thread(target=enqueuer, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=observer))
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        deadline = time.monotonic() + 20
        dropped: list[DroppedPartition] = []
        while days[1] not in {d.name for d in dropped} and time.monotonic() < deadline:
            dropped = pg_store.drop_partitions(TTL, 1)  # the empty older ones go first
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not failures, failures
    assert [d.name for d in dropped] == [days[1]]
    assert days[1] not in partitions(pg)

    assert not twice, f"two jobs held one key at once: {twice[:5]}"
    created = [(k, j) for k, j, c in answers if c]
    assert len({k for k, _ in created}) == len(created), "a key accepted twice"
    new = dict(created)
    for key, job_id, was_created in answers:
        assert job_id in (old[key], new.get(key)), f"{key}: a third job {job_id}"
        if job_id == old[key]:
            assert not was_created
    # After the first new job of a key, the old one is never answered again.
    seen_new: set[str] = set()
    for key, job_id, _ in answers:
        if job_id == new.get(key):
            seen_new.add(key)
        else:
            assert key not in seen_new, f"{key}: the dropped job answered after a new one"
    assert len(created) > 0 and any(j == old[k] for k, j, _ in answers), "no race happened"
    # In the end each key is held once, by a job that exists.
    held = keys(pg)
    rows = dict(pg.execute("SELECT idempotency_key, id::text FROM job").fetchall())
    assert {k: held[("work", k)] for k in new} == {k: rows[k] for k in new} == new


def test_views_read_across_partitions(pg: psycopg.Connection[Any], dsn: str) -> None:
    from brooq.engine.filters import JobFilter
    from brooq.postgres.inspection import PostgresInspection

    days = past_layout(pg, 10)
    now = datetime.now(UTC)
    spread = [
        *insert_rows(pg, now - 8 * DAY, ["done"]),
        *insert_rows(pg, now - 2 * DAY, ["dead"]),
        *insert_rows(pg, now, ["pending"]),
        *insert_rows(pg, now + 30 * DAY, ["pending"]),  # beyond every range: the default
    ]
    assert len({partition_of(pg, j) for j in spread}) == 4
    assert partition_of(pg, spread[-1]) == "job_default" and partition_of(pg, spread[0]) in days
    inspection = PostgresInspection(dsn)
    try:
        depth = {(r.state, r.jobs) for r in inspection.depth()}
        assert depth == {("done", 1), ("dead", 1), ("pending", 2)}
        page = inspection.list_jobs(JobFilter())
        assert {r.id for r in page.rows} == set(spread)
        assert inspection.count_jobs(JobFilter()) == 4
        assert all(inspection.job(j).id == j for j in spread)
    finally:
        inspection.close()
