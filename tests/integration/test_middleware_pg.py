"""Enqueue middleware on PostgreSQL: sync and asyncio, one job and a batch, in the caller's
transaction; what a middleware replaces is what is written, and a refusal writes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import psycopg
import pytest

import brooq
from brooq.engine.middleware import AsyncEnqueueNext, EnqueueNext
from brooq.vocabulary import Enqueued, Job

pytestmark = pytest.mark.db


class Stamp(brooq.Middleware):
    """Puts the tenant into every job's rate_key, sync and async; refuses tenant 'x'."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def _stamped(self, jobs: list[Job]) -> list[Job]:
        if any(job.payload == "x" for job in jobs):
            raise PermissionError("tenant x may not enqueue")
        return [dataclasses.replace(job, rate_key=f"tenant-{job.payload}") for job in jobs]

    def enqueue(self, jobs: list[Job], call_next: EnqueueNext) -> list[Enqueued]:
        self.calls.append(f"sync {len(jobs)}")
        return call_next(self._stamped(jobs))

    async def enqueue_async(self, jobs: list[Job], call_next: AsyncEnqueueNext) -> list[Enqueued]:
        self.calls.append(f"async {len(jobs)}")
        return await call_next(self._stamped(jobs))


def rate_keys(pg: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in pg.execute("SELECT rate_key FROM job ORDER BY id")]


def test_sync_enqueues_go_through_the_middleware(dsn: str, pg: psycopg.Connection[Any]) -> None:
    calls: list[str] = []
    queue = brooq.Queue(dsn, middleware=[Stamp(calls)])
    try:
        queue.enqueue(Job("report", "a"))
        queue.enqueue_many([Job("report", "b"), Job("report", "c")])
        with psycopg.connect(dsn) as conn:
            queue.enqueue(Job("report", "d"), conn=conn)
            conn.rollback()  # the caller's transaction: the job goes with it
        with pytest.raises(PermissionError):
            queue.enqueue_many([Job("report", "e"), Job("report", "x")])
    finally:
        queue.close()
    assert rate_keys(pg) == ["tenant-a", "tenant-b", "tenant-c"]
    assert calls == ["sync 1", "sync 2", "sync 1", "sync 2"]


def test_asyncio_enqueues_go_through_the_middleware(dsn: str, pg: psycopg.Connection[Any]) -> None:
    calls: list[str] = []
    queue = brooq.Queue(dsn, middleware=[Stamp(calls)])

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            await queue.enqueue_async(Job("report", "a"), conn=aconn)
            await queue.enqueue_many_async([Job("report", "b"), Job("report", "c")], conn=aconn)
            with pytest.raises(PermissionError):
                await queue.enqueue_many_async([Job("report", "x")], conn=aconn)
            await aconn.commit()

    asyncio.run(main())
    assert rate_keys(pg) == ["tenant-a", "tenant-b", "tenant-c"]
    assert calls == ["async 1", "async 2", "async 1"]


def test_tracing_an_asyncio_bulk_enqueue_stores_the_send_spans_context(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from brooq.otel import Tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = brooq.Queue(dsn, middleware=[Tracing(provider)])

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            await queue.enqueue_many_async([Job("report"), Job("report")], conn=aconn)
            await aconn.commit()

    asyncio.run(main())
    (send,) = exporter.get_finished_spans()
    c = send.get_span_context()
    assert send.name == "send report" and c is not None
    stored = {r[0]["traceparent"] for r in pg.execute("SELECT trace_context FROM job")}
    assert stored == {f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"}
