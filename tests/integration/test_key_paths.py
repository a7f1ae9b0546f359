"""Every enqueue path holds its idempotency key in job_key: a duplicate through any path
returns the job of the first, and the key table holds exactly one key for it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from brooq.cli import main
from brooq.engine.outcome import DONE
from brooq.engine.periodic import PeriodicScheduler
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job, Schedule, State
from tests.integration.partitions import keys

pytestmark = pytest.mark.db


def _paths(dsn: str, store: PostgresStore) -> dict[str, Any]:
    queue = brooq.Queue(dsn)

    def single(key: str) -> brooq.Enqueued:
        return queue.enqueue(Job("work", idempotency_key=key))

    def bulk(key: str) -> brooq.Enqueued:
        return queue.enqueue_many([Job("work", idempotency_key=key), Job("work")])[0]

    def given_conn(key: str) -> brooq.Enqueued:
        with psycopg.connect(dsn) as conn, conn.transaction():
            return queue.enqueue(Job("work", idempotency_key=key), conn=conn)

    def on_asyncio(key: str) -> brooq.Enqueued:
        async def go() -> brooq.Enqueued:
            aconn = await psycopg.AsyncConnection.connect(dsn)
            async with aconn, aconn.transaction():
                return await brooq.enqueue_async(aconn, Job("work", idempotency_key=key))

        return asyncio.run(go())

    def chained(key: str) -> brooq.Enqueued:
        (parent,) = store.enqueue_many([Job("parent")])
        claimed = store.claim("w", ["parent"], timedelta(seconds=30))
        assert claimed is not None and claimed.id == parent.id
        assert store.settle(claimed.ticket, DONE, chain=[Job("work", idempotency_key=key)])
        (found,) = store.enqueue_many([Job("work", idempotency_key=key)])
        return found

    return {
        "single": single,
        "bulk": bulk,
        "conn": given_conn,
        "async": on_asyncio,
        "chain": chained,
        "_queue": queue,
    }


@pytest.mark.parametrize("path", ["single", "bulk", "conn", "async", "chain"])
def test_a_key_written_by_any_path_is_held_by_every_other(
    dsn: str, pg: psycopg.Connection[Any], pg_store: PostgresStore, path: str
) -> None:
    paths = _paths(dsn, pg_store)
    try:
        first = paths[path]("k")
        job_id = first.id
        assert keys(pg) == {("work", "k"): job_id}
        for other in ("single", "bulk", "conn", "async"):
            again = paths[other]("k")
            assert (again.id, again.created, again.state) == (job_id, False, State.PENDING)
        assert keys(pg) == {("work", "k"): job_id}
        rows = pg.execute("SELECT count(*) FROM job WHERE idempotency_key = 'k'").fetchone()
        assert rows == (1,)
    finally:
        paths["_queue"].close()


def test_the_cli_and_the_schedules_key_their_jobs(
    dsn: str,
    pg: psycopg.Connection[Any],
    pg_store: PostgresStore,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", dsn)
    for _ in range(2):
        assert main(["enqueue", "--topic", "work", "--payload", "{}", "--key", "cli-1"]) == 0
    schedule = Schedule("*/5 * * * *", topic="tick")
    for _ in range(2):  # two supervisors see the same run due
        PeriodicScheduler([schedule], pg_store.enqueue_many, pg_store.last_scheduled_run).run_once(
            datetime(2026, 12, 3, 12, 1, tzinfo=UTC)
        )
    held = keys(pg)
    rows = dict(pg.execute("SELECT idempotency_key, id::text FROM job").fetchall())
    assert len(rows) == 2 and held == {(t, k): rows[k] for t, k in held}
    assert ("work", "cli-1") in held
    assert pg_store.last_scheduled_run(schedule) is not None
