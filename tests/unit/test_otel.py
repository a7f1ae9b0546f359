"""brooq.otel.Tracing over the in-memory store, with the SDK's in-memory exporter: the spans
of an enqueue and of each attempt, their names, kinds, links or parents, and attributes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import brooq
from brooq.engine.executor import crashed
from brooq.engine.fake import InMemoryStore
from brooq.engine.outcome import crash_outcome
from brooq.engine.store import Claimed, Ticket
from brooq.otel import Tracing
from brooq.vocabulary import BUILTIN_KIND_DEFAULTS, Claim, Job


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


def traced(exporter: InMemorySpanExporter, **options: Any) -> tuple[brooq.Queue, TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return brooq.Queue(InMemoryStore(), middleware=[Tracing(provider, **options)]), provider


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def traceparent(span: ReadableSpan) -> str:
    c = span.get_span_context()
    assert c is not None
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def test_an_enqueue_records_a_send_span_and_stores_its_context(
    spans: InMemorySpanExporter,
) -> None:
    queue, provider = traced(spans)
    with provider.get_tracer("web").start_as_current_span("POST /orders") as request:
        job_id = queue.enqueue(Job("email.send", {"to": "a"})).id
    (send,) = named(spans, "send")
    assert (send.name, send.kind) == ("send email.send", SpanKind.PRODUCER)
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "brooq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "email.send",
        "messaging.message.id": job_id,
    }
    stored = queue.get(job_id)
    assert stored.trace_context == {"traceparent": traceparent(send)}
    assert stored.payload == {"to": "a"}  # never in the payload


def test_a_bulk_enqueue_is_one_send_span_and_every_job_carries_it(
    spans: InMemorySpanExporter,
) -> None:
    queue, _ = traced(spans)
    ids = [e.id for e in queue.enqueue_many([Job("a.b"), Job("a.b"), Job("a.b")])]
    mixed = queue.enqueue_many([Job("a.b"), Job("c.d")])
    one, two = named(spans, "send")
    assert one.name == "send a.b" and (one.attributes or {})["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in (one.attributes or {})
    assert {queue.get(i).trace_context["traceparent"] for i in ids} == {traceparent(one)}  # type: ignore[index]
    assert two.name == "send" and "messaging.destination.name" not in (two.attributes or {})
    assert queue.get(mixed[1].id).trace_context == {"traceparent": traceparent(two)}


def test_each_attempt_is_a_process_span_linked_to_the_send_with_a_settle_under_it(
    spans: InMemorySpanExporter,
) -> None:
    queue, provider = traced(spans)
    inner = provider.get_tracer("app")

    @queue.kind("a.b", max_attempts=3, backoff_base="1ms", backoff_max="1ms")
    def handler(claim: Claim) -> None:
        with inner.start_as_current_span("handler work"):
            if claim.attempt == 1:
                raise ConnectionError("smtp down")

    job_id = queue.enqueue(Job("a.b")).id
    queue.drain()
    time.sleep(0.01)
    queue.drain()
    (send,) = named(spans, "send")
    first, second = named(spans, "process")
    for attempt, span, outcome in ((1, first, "failed"), (2, second, "done")):
        assert (span.name, span.kind, span.parent) == ("process a.b", SpanKind.CONSUMER, None)
        assert [link.context.span_id for link in span.links] == [send.context.span_id]
        attrs = dict(span.attributes or {})
        assert attrs["messaging.system"] == "brooq"
        assert attrs["messaging.operation.type"] == "process"
        assert attrs["messaging.destination.name"] == "a.b"
        assert attrs["messaging.message.id"] == job_id
        assert attrs["messaging.brooq.attempt"] == attempt
        assert attrs["messaging.brooq.outcome"] == outcome
    assert (first.attributes or {})["error.type"] == "ConnectionError"
    assert first.status.status_code == StatusCode.ERROR
    assert "error.type" not in (second.attributes or {})
    assert second.status.status_code == StatusCode.UNSET
    settles = named(spans, "settle")
    assert [s.kind for s in settles] == [SpanKind.CLIENT] * 2
    assert [(s.attributes or {})["messaging.operation.type"] for s in settles] == ["settle"] * 2
    assert [s.parent.span_id for s in settles if s.parent] == [
        first.context.span_id,
        second.context.span_id,
    ]
    works = named(spans, "handler work")
    assert [w.parent.span_id for w in works if w.parent] == [
        first.context.span_id,
        second.context.span_id,
    ]


def test_parent_makes_the_attempt_a_child_of_the_send(spans: InMemorySpanExporter) -> None:
    queue, _ = traced(spans, parent=True)

    @queue.kind("a.b")
    async def handler(claim: Claim) -> None:
        with trace.get_tracer("app").start_as_current_span("never exported"):
            await asyncio.sleep(0)  # the global provider: a no-op tracer

    queue.enqueue(Job("a.b"))
    queue.drain()
    (send,) = named(spans, "send")
    (process,) = named(spans, "process")
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert process.context.trace_id == send.context.trace_id and not process.links


def test_a_job_without_a_trace_context_starts_a_trace_of_its_own(
    spans: InMemorySpanExporter,
) -> None:
    queue, _ = traced(spans)
    queue.register("a.b", lambda claim: None)
    queue.store.enqueue_many([Job("a.b")])  # enqueued by something untraced
    queue.drain()
    (process,) = named(spans, "process")
    assert not process.links and process.parent is None
    assert (process.attributes or {})["messaging.brooq.outcome"] == "done"


def test_a_trace_context_given_with_the_job_is_kept(spans: InMemorySpanExporter) -> None:
    queue, _ = traced(spans)
    given = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    job_id = queue.enqueue(Job("a.b", trace_context=given)).id
    assert queue.get(job_id).trace_context == given


def test_a_failed_enqueue_leaves_an_error_on_its_send_span(spans: InMemorySpanExporter) -> None:
    queue, _ = traced(spans)
    with pytest.raises(brooq.NeedsDatabase):
        queue.enqueue(Job("a.b"), conn=object())  # type: ignore[arg-type]
    (send,) = named(spans, "send")
    assert (send.attributes or {})["error.type"] == "NeedsDatabase"
    assert send.status.status_code == StatusCode.ERROR


def test_an_attempt_whose_worker_died_is_recorded_where_the_supervisor_hears_of_it(
    spans: InMemorySpanExporter,
) -> None:
    queue, _ = traced(spans)
    queue.register("a.b", lambda claim: None, max_attempts=1)
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    claimed = Claimed(
        Ticket("01a242f0-6204-7054-94fb-1b4d8d2911fa", "host:1:x", 1),
        "a.b",
        "{}",
        datetime.now(UTC) + timedelta(minutes=1),
        trace_context=json.dumps(carrier),
    )
    options = BUILTIN_KIND_DEFAULTS.overridden_by(Job("a.b", max_attempts=1).overrides)
    outcome = crash_outcome("max_execution_timeout exceeded; killed (SIGKILL)", 1, options)
    crashed(queue.registry, claimed, outcome, time.monotonic() - 2.0)
    (process,) = named(spans, "process")
    attrs = dict(process.attributes or {})
    assert (attrs["messaging.brooq.outcome"], attrs["error.type"]) == ("dead", "WorkerCrashed")
    assert [link.context.span_id for link in process.links] == [0xB7AD6B7169203331]
    assert process.end_time is not None and process.start_time is not None
    assert process.end_time - process.start_time >= 1.9e9  # from when the attempt began
    assert "max_execution_timeout exceeded" in (process.status.description or "")


def test_process_exit_flushes_what_a_batch_processor_holds(spans: InMemorySpanExporter) -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(spans, schedule_delay_millis=600_000))
    tracing = Tracing(provider)
    queue = brooq.Queue(InMemoryStore(), middleware=[tracing])
    queue.enqueue(Job("a.b"))
    assert spans.get_finished_spans() == ()
    tracing.process_exit()
    assert [s.name for s in spans.get_finished_spans()] == ["send a.b"]
    provider.shutdown()
