"""An app traced with brooq.otel: its spans go to the JSON-lines file BROOQ_TEST_SPANS, one
line per span with the pid of the process that recorded it, each span as it ends. With
SPANS_BATCHED=1 through a batch processor that exports nothing before its process ends
instead (what reaches the file from a worker was flushed by the middleware's process_exit;
a worker killed by the watchdog would lose what it holds). TRACE_AS_PARENT=1: attempts
are children of the enqueue's span instead of linked to it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

import brooq
from brooq.otel import Tracing


class FileExporter(SpanExporter):
    """Appends each span as one JSON line (one write per batch: lines never interleave)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(as_dict(span)) + "\n" for span in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [
            f"{link.context.trace_id:032x}-{link.context.span_id:016x}" for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "pid": os.getpid(),
    }


provider = TracerProvider()
exporter = FileExporter(os.environ["BROOQ_TEST_SPANS"])
if os.environ.get("SPANS_BATCHED") == "1":
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
else:
    provider.add_span_processor(SimpleSpanProcessor(exporter))
queue = brooq.Queue(
    os.environ["DATABASE_URL"],
    middleware=[Tracing(provider, parent=os.environ.get("TRACE_AS_PARENT") == "1")],
)
app = provider.get_tracer("sysapp")


@queue.kind("traced.ok")
def ok(claim: brooq.Claim) -> None:
    """A span of the handler's own, under the attempt's."""
    with app.start_as_current_span("handler work"):
        pass


@queue.kind("traced.flaky", max_attempts=3, backoff_base="10ms", backoff_max="10ms")
def flaky(claim: brooq.Claim) -> None:
    """Fails its first attempt."""
    if claim.attempt == 1:
        raise ConnectionError("downstream down")


@queue.kind("traced.hang", max_attempts=1)
def hang(claim: brooq.Claim) -> None:
    """Outlives its job's max_execution_timeout: the supervisor kills its worker."""
    time.sleep(30)
