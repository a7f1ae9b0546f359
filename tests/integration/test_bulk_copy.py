"""A large keyless batch is written with COPY: the rows exactly as given, the same Enqueued
values, one NOTIFY per topic, in the caller's transaction or one of its own, every check
made before a byte is sent; and the wire shows the COPY (libpq's own trace).

Issue 32, item 17: bulk enqueue ran at 0.52-0.62 of a raw COPY of the same rows.
"""

from __future__ import annotations

import asyncio
import tempfile
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import brooq
from brooq.postgres.bulk import COPY_MIN_JOBS, copyable
from brooq.postgres.enqueue import enqueue_on, enqueue_on_async
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import InvalidJob, Job, State

pytestmark = pytest.mark.db

N = COPY_MIN_JOBS * 3
ODD = ["tab\there", "new\nline", "back\\slash", "\\N", "cr\rlf", "quote\"'", "é ☃ 𝄞", "end\\"]


def rows(pg: psycopg.Connection[Any], ids: list[str]) -> list[tuple[Any, ...]]:
    found = {
        str(r[0]): tuple(r[1:])
        for r in pg.execute(
            "SELECT id, topic, payload, priority, rate_key, available_at, state, attempts, "
            "idempotency_key, workflow_id, parents_left FROM job WHERE id = ANY(%s::uuid[])",
            (ids,),
        )
    }
    return [found[i] for i in ids if i in found]


def odd_jobs(n: int = N) -> list[Job]:
    """Payloads and rate keys holding every character COPY's text format escapes."""
    return [
        Job(
            "bulk.a" if i % 2 else "bulk.b",
            {"i": i, "text": ODD[i % len(ODD)], "nested": [ODD[(i + 1) % len(ODD)], None]},
            priority=i % 7 - 3,
            rate_key=ODD[i % len(ODD)] if i % 3 else None,
        )
        for i in range(n)
    ]


def plain_odd_jobs(n: int = N) -> list[Job]:
    """Jobs that set only a topic and a payload (the three-column COPY), the payloads
    holding every character COPY's text format escapes, in values, keys and bare strings."""
    return [
        Job(
            "bulk.a" if i % 2 else "bulk.b",
            ODD[i % len(ODD)]
            if i % 5 == 0
            else {"i": i, ODD[i % len(ODD)]: [ODD[(i + 1) % len(ODD)], None, "\\\\"]},
        )
        for i in range(n)
    ]


def traced(conn: psycopg.Connection[Any], run: Any) -> tuple[Any, str]:
    """``run()`` with libpq's protocol trace of ``conn``; its result and the trace."""
    with tempfile.TemporaryFile("w+") as f:
        conn.pgconn.trace(f.fileno())
        try:
            result = run()
        finally:
            conn.pgconn.untrace()
        f.seek(0)
        return result, f.read()


def test_a_large_keyless_batch_goes_through_copy_exactly_as_given(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    jobs = odd_jobs()
    assert copyable(jobs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = datetime.now(UTC)
        done, trace = traced(conn, lambda: enqueue_on(conn, jobs))
    assert "COPY job (id, payload, topic, priority, rate_key, app_version) FROM STDIN" in trace
    assert "INSERT" not in trace
    assert [(e.created, e.state) for e in done] == [(True, State.PENDING)] * N
    assert len({e.id for e in done}) == N and [e.id for e in done] == sorted(e.id for e in done)
    got = rows(pg, [e.id for e in done])
    for job, row in zip(jobs, got, strict=True):
        topic, payload, priority, rate_key, at, state, attempts, key, workflow, left = row
        assert (topic, payload, priority, rate_key) == (
            job.topic,
            job.payload,
            job.priority,
            job.rate_key,
        )
        assert (state, attempts, key, workflow, left) == ("pending", 0, None, None, 0)
        assert before - timedelta(minutes=1) < at < datetime.now(UTC) + timedelta(minutes=1)


def ascii_dict_jobs(n: int = N) -> list[Job]:
    """Plain jobs whose payloads are ASCII dicts (checked as one batch by the encoder)."""
    odd = [text for text in ODD if text.isascii()]
    return [Job("bulk.a", {"i": i, "s": odd[i % len(odd)], "lit": "\\N\\\\"}) for i in range(n)]


@pytest.mark.parametrize("make", [plain_odd_jobs, ascii_dict_jobs])
def test_jobs_setting_only_topic_and_payload_go_through_three_columns(
    dsn: str, pg: psycopg.Connection[Any], make: Any
) -> None:
    # Issue 32: priority, rate_key and app_version would be their defaults on every row,
    # so the COPY leaves them out; the payloads' backslashes are escaped in one go.
    jobs = make()
    assert copyable(jobs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        done, trace = traced(conn, lambda: enqueue_on(conn, jobs))
        versioned, trace_v = traced(conn, lambda: enqueue_on(conn, jobs, app_version="v2"))
    assert "COPY job (id, payload, topic) FROM STDIN" in trace and "INSERT" not in trace
    assert "COPY job (id, payload, topic, priority, rate_key, app_version)" in trace_v
    ids = [e.id for e in done + versioned]
    assert ids == sorted(ids) and len(set(ids)) == 2 * N
    assert [(e.created, e.state) for e in done] == [(True, State.PENDING)] * N
    for batch, version in ((done, None), (versioned, "v2")):
        got = pg.execute(
            "SELECT topic, payload, priority, rate_key, app_version, state, attempts "
            "FROM job WHERE id = ANY(%s::uuid[]) ORDER BY id",
            ([e.id for e in batch],),
        ).fetchall()
        assert got == [(j.topic, j.payload, 0, None, version, "pending", 0) for j in jobs]


def test_jobs_with_their_own_times_go_through_copy_with_them(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    at = datetime(2031, 2, 3, 4, 5, 6, 789000, tzinfo=UTC)
    jobs = [Job("bulk.a", i, available_at=at + timedelta(seconds=i)) for i in range(N)]
    done = pg_store.enqueue_many(jobs)
    assert [r[4] for r in rows(pg, [e.id for e in done])] == [j.available_at for j in jobs]
    # Some with a time and some without: now() is the database's, so not COPY (same rows).
    mixed = [Job("bulk.a", i, available_at=at if i % 2 else None) for i in range(N)]
    assert not copyable(mixed)
    done = pg_store.enqueue_many(mixed)
    got = [r[4] for r in rows(pg, [e.id for e in done])]
    assert got[1::2] == [at] * (N // 2) and all(t < at for t in got[::2])


@pytest.mark.parametrize("notify", [True, False])
def test_one_notify_per_topic_sent_when_the_rows_commit(dsn: str, notify: bool) -> None:
    store = PostgresStore(dsn, notify=notify)
    try:
        with psycopg.connect(dsn, autocommit=True) as listener:
            listener.execute("LISTEN brooq_job")
            store.enqueue_many(odd_jobs())
            got = [n.payload for n in listener.notifies(timeout=0.5, stop_after=3)]
    finally:
        store.close()
    assert sorted(got) == (["bulk.a", "bulk.b"] if notify else [])


def test_in_the_callers_transaction_the_rows_and_notifies_follow_it(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN brooq_job")
        with psycopg.connect(dsn) as conn:  # not autocommit: the caller commits
            done = enqueue_on(conn, odd_jobs())
            assert rows(pg, [e.id for e in done]) == []  # not committed yet
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
            conn.rollback()
            assert enqueue_on(conn, odd_jobs()) and conn.info.transaction_status.name == "INTRANS"
            conn.commit()
        assert pg.execute("SELECT count(*) FROM job").fetchone() == (N,)
        assert len(list(listener.notifies(timeout=0.5, stop_after=2))) == 2


def test_a_bad_job_stops_the_batch_before_anything_is_sent_and_the_transaction_lives(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    jobs = odd_jobs()
    bad = [*jobs[:100], Job("bulk.a", {"n": float("nan")}), *jobs[100:]]
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        with pytest.raises(InvalidJob, match="NaN"):
            enqueue_on(conn, bad)
        with pytest.raises(InvalidJob, match="above the limit of 100"):
            enqueue_on(conn, [*jobs[:-1], Job("bulk.a", "x" * 200)], max_payload_bytes=100)
        conn.execute("INSERT INTO orders VALUES (2)")  # the caller's transaction goes on
        conn.commit()
    assert pg.execute("SELECT count(*) FROM orders").fetchone() == (2,)
    assert pg.execute("SELECT count(*) FROM job").fetchone() == (0,)


@pytest.mark.parametrize("make", [odd_jobs, plain_odd_jobs])
def test_the_asyncio_path_writes_the_same_rows(
    dsn: str, pg: psycopg.Connection[Any], make: Any
) -> None:
    jobs = make()

    async def enqueue() -> list[brooq.Enqueued]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await enqueue_on_async(aconn, jobs)

    done = asyncio.run(enqueue())
    got = rows(pg, [e.id for e in done])
    assert [(r[0], r[1], r[2], r[3]) for r in got] == [
        (j.topic, j.payload, j.priority, j.rate_key) for j in jobs
    ]


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_small_or_keyed_or_dependent_batches_take_the_statements() -> None:
    plain = [Job("bulk.a", i) for i in range(COPY_MIN_JOBS)]
    assert copyable(plain) and not copyable(plain[:-1])
    assert not copyable([*plain, Job("bulk.a", idempotency_key="k")])
    parent = "01900000-0000-7000-8000-000000000001"
    assert not copyable([*plain, Job("bulk.a", after=[parent])])
    # Columns COPY does not write: such a batch takes the statements, which keep them.
    assert not copyable([*plain, Job("bulk.a", max_attempts=20)])
    assert not copyable([*plain, Job("bulk.a", trace_context={"traceparent": TRACEPARENT})])


def test_a_bulk_batch_keeps_every_job_s_overrides_and_trace_context(dsn: str) -> None:
    jobs = [Job("bulk.a", i) for i in range(N)]
    jobs[7] = Job("bulk.a", 7, max_attempts=20, trace_context={"traceparent": TRACEPARENT})
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = enqueue_on(conn, jobs)
        row = conn.execute(
            "SELECT max_attempts, trace_context->>'traceparent' FROM job WHERE id = %s",
            (done[7].id,),
        ).fetchone()
    assert row == (20, TRACEPARENT)


def test_a_keyed_batch_is_not_written_with_copy(dsn: str) -> None:
    jobs = [Job("bulk.a", i, idempotency_key=f"k{i}") for i in range(N)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        done, trace = traced(conn, lambda: enqueue_on(conn, jobs))
    assert "COPY" not in trace and all(e.created for e in done)
