"""Traces across real processes: a span opened in this test's process, jobs enqueued inside
it (this process exports to the SDK's in-memory exporter), run by ``brooq supervise`` in
another process tree, whose supervisor and workers export to a file (tests/system/apps/
sysapp_traced.py). Each attempt's span carries the link to the enqueue's span (or is its
child), the messaging attributes, the attempt and the outcome; a bulk enqueue, a retry and
a job killed by the watchdog each leave the right spans."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import brooq
from brooq.otel import Tracing
from tests.system.harness import all_terminal, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

ARGS = ("--workers", "2", "--http-addr", "127.0.0.1:0", "--poll-interval", "200ms")


def ids_of(span: ReadableSpan) -> str:
    c = span.get_span_context()
    assert c is not None
    return f"{c.trace_id:032x}-{c.span_id:016x}"


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def enqueue_traced(dsn: str, exporter: InMemorySpanExporter) -> dict[str, Any]:
    """Open a request span, enqueue inside it (one job each, and a bulk of three)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = brooq.Queue(dsn, middleware=[Tracing(provider)])
    try:
        with provider.get_tracer("web").start_as_current_span("POST /checkout"):
            ok = queue.enqueue(brooq.Job("traced.ok")).id
            bulk = [e.id for e in queue.enqueue_many([brooq.Job("traced.ok")] * 3)]
            flaky = queue.enqueue(brooq.Job("traced.flaky")).id
            hang = queue.enqueue(brooq.Job("traced.hang", max_execution_timeout="1s")).id
    finally:
        queue.close()
    return {"ok": ok, "bulk": bulk, "flaky": flaky, "hang": hang}


@pytest.mark.timeout(90)
def test_an_attempt_in_a_worker_is_linked_to_the_enqueue_in_this_process(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    jobs = enqueue_traced(dsn, exporter)
    local = exporter.get_finished_spans()
    request = next(s for s in local if s.name == "POST /checkout")
    sends = {s.attributes["messaging.message.id"]: s for s in local if s.name.startswith("send")
             and s.attributes and "messaging.message.id" in s.attributes}  # fmt: skip
    (bulk_send,) = [s for s in local if (s.attributes or {}).get("messaging.batch.message_count")]
    assert bulk_send.name == "send traced.ok" and bulk_send.parent is not None
    assert f"{bulk_send.parent.span_id:016x}" == ids_of(request).split("-")[1]

    file = tmp_path / "spans.jsonl"
    sup = supervise(*ARGS, app="sysapp_traced:queue", env={"BROOQ_TEST_SPANS": str(file)})
    wait_until(lambda: all_terminal(pg), 45, "every traced job ended")
    assert sup.stop(timeout=30) == 0  # its workers flush at exit (process_exit), it at exit
    spans = read_spans(file)
    by_job: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        if span["name"].startswith("process "):
            by_job.setdefault(span["attributes"]["messaging.message.id"], []).append(span)

    def check(span: dict[str, Any], job_id: str, topic: str, attempt: int, outcome: str) -> None:
        attrs = span["attributes"]
        assert (span["name"], span["kind"]) == (f"process {topic}", "CONSUMER")
        assert attrs["messaging.system"] == "brooq"
        assert attrs["messaging.operation.type"] == "process"
        assert attrs["messaging.destination.name"] == topic
        assert (attrs["messaging.brooq.attempt"], attrs["messaging.brooq.outcome"]) == (
            attempt,
            outcome,
        )
        assert span["pid"] != sup.pid or outcome == "dead"

    (ok,) = by_job[jobs["ok"]]
    check(ok, jobs["ok"], "traced.ok", 1, "done")
    assert ok["links"] == [ids_of(sends[jobs["ok"]])] and ok["parent_id"] is None
    (work,) = [s for s in spans if s["name"] == "handler work" and s["trace_id"] == ok["trace_id"]]
    assert work["parent_id"] == ok["span_id"]
    settle = [
        s for s in spans if s["name"] == "settle traced.ok" and s["parent_id"] == ok["span_id"]
    ]
    assert settle and settle[0]["attributes"]["messaging.operation.type"] == "settle"

    for job_id in jobs["bulk"]:  # one send span for the three
        (one,) = by_job[job_id]
        check(one, job_id, "traced.ok", 1, "done")
        assert one["links"] == [ids_of(bulk_send)]

    first, second = sorted(
        by_job[jobs["flaky"]], key=lambda s: s["attributes"]["messaging.brooq.attempt"]
    )
    check(first, jobs["flaky"], "traced.flaky", 1, "failed")
    assert (first["attributes"]["error.type"], first["status"]) == ("ConnectionError", "ERROR")
    check(second, jobs["flaky"], "traced.flaky", 2, "done")
    assert first["links"] == second["links"] == [ids_of(sends[jobs["flaky"]])]

    (killed,) = by_job[jobs["hang"]]  # the worker was SIGKILLed: the supervisor recorded it
    check(killed, jobs["hang"], "traced.hang", 1, "dead")
    assert killed["pid"] == sup.pid
    assert (killed["attributes"]["error.type"], killed["status"]) == ("WorkerCrashed", "ERROR")
    assert killed["links"] == [ids_of(sends[jobs["hang"]])]


@pytest.mark.timeout(60)
def test_with_parent_the_attempt_continues_the_enqueues_trace(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = brooq.Queue(dsn, middleware=[Tracing(provider)])
    with provider.get_tracer("web").start_as_current_span("POST /checkout"):
        job_id = queue.enqueue(brooq.Job("traced.ok")).id
    queue.close()
    (send,) = [s for s in exporter.get_finished_spans() if s.name == "send traced.ok"]
    file = tmp_path / "spans.jsonl"
    env = {"BROOQ_TEST_SPANS": str(file), "TRACE_AS_PARENT": "1", "SPANS_BATCHED": "1"}
    sup = supervise(*ARGS, app="sysapp_traced:queue", env=env)
    wait_until(lambda: all_terminal(pg), 30, "the job ended")
    assert read_spans(file) == []  # the batch processor holds them
    assert sup.stop(timeout=30) == 0  # the worker's process_exit flushes them
    (process,) = [s for s in read_spans(file) if s["name"] == "process traced.ok"]
    assert process["attributes"]["messaging.message.id"] == job_id
    trace_id, span_id = ids_of(send).split("-")
    assert (process["trace_id"], process["parent_id"], process["links"]) == (trace_id, span_id, [])
