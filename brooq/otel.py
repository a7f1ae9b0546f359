"""OpenTelemetry traces from enqueue to handler, as a middleware (``pip install brooq[otel]``).

Only the OpenTelemetry API is used: the application chooses its SDK,
exporters and propagators. ``import brooq`` never loads this module; the
application imports it and adds the middleware to its queue::

    from brooq.otel import Tracing
    queue.use(Tracing())

An enqueue records a PRODUCER span ``send {topic}`` and stores its context
with each job (``Job.trace_context``, the ``trace_context`` column: the
propagators' carrier, W3C ``traceparent``/``tracestate`` by default), never in
the payload. Each attempt records a CONSUMER span ``process {topic}`` where it
runs, linked to the enqueue's span (or its child, ``Tracing(parent=True)``),
current while the handler runs, and a ``settle {topic}`` span under it from
the handler's return to its outcome. Names and attributes follow the
OpenTelemetry messaging conventions; brooq's own are under
``messaging.brooq.*``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from brooq import __version__
from brooq.engine.middleware import (
    AsyncEnqueueNext,
    EnqueueNext,
    Middleware,
    RunNext,
    Settled,
)
from brooq.vocabulary import Claim, Enqueued, Job

SYSTEM = "brooq"
FAILED_OUTCOMES = frozenset({"failed", "dead", "preserved", "abandoned"})
"""Outcomes whose span gets status ERROR and ``error.type`` (delayed and canceled are the
handler's own decisions, not errors)."""
MAX_OPEN = 1000
"""Process spans kept open for their settle at most (one per attempt running here)."""


class Tracing(Middleware):
    """Spans for every enqueue and every attempt of a job, linked across processes.

    ``tracer_provider``: where spans go (None: the global one, looked up when a span
    starts). ``parent``: make each attempt's span a child of the enqueue's span (one
    trace from the web request to the handler) instead of the start of a trace of its
    own, linked to it (the conventions' default: a job may run long after, and many
    times).
    """

    def __init__(self, tracer_provider: Any = None, *, parent: bool = False) -> None:
        self.provider = tracer_provider
        self.parent = parent
        self.tracer = trace.get_tracer("brooq", __version__, tracer_provider=tracer_provider)
        self._open: dict[tuple[str, int], tuple[Span, int]] = {}

    # --- enqueue -----------------------------------------------------------------------------

    def enqueue(self, jobs: list[Job], call_next: EnqueueNext) -> list[Enqueued]:
        """A ``send`` span around the write; each job carries its context."""
        with self._sending(jobs) as span:
            try:
                done = call_next(self._stamped(jobs))
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                raise
            _sent(span, done)
            return done

    async def enqueue_async(self, jobs: list[Job], call_next: AsyncEnqueueNext) -> list[Enqueued]:
        """:meth:`enqueue` for asyncio."""
        with self._sending(jobs) as span:
            try:
                done = await call_next(self._stamped(jobs))
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                raise
            _sent(span, done)
            return done

    def _sending(self, jobs: Sequence[Job]) -> Any:
        topics = {job.topic for job in jobs}
        topic = next(iter(topics)) if len(topics) == 1 else None
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if topic is not None:
            attributes["messaging.destination.name"] = topic
        if len(jobs) != 1:
            attributes["messaging.batch.message_count"] = len(jobs)
        return self.tracer.start_as_current_span(
            f"send {topic}" if topic else "send", kind=SpanKind.PRODUCER, attributes=attributes
        )

    @staticmethod
    def _stamped(jobs: list[Job]) -> list[Job]:
        """The jobs, each carrying the current (send) span's context; a job given a trace
        context of its own keeps it."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if not carrier:
            return jobs
        return [
            job
            if job.trace_context is not None
            else dataclasses.replace(job, trace_context=carrier)
            for job in jobs
        ]

    # --- run and settle ----------------------------------------------------------------------

    def run(self, claim: Claim, call_next: RunNext) -> Any:
        """A ``process`` span, current while the handler runs (its own spans are children)."""
        span = self._processing(claim, None)
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            try:
                return call_next(claim)
            except BaseException as exc:
                span.record_exception(exc)
                raise
            finally:
                self._keep(claim, span)

    def settled(self, claim: Claim, settled: Settled) -> None:
        """The attempt's outcome on its ``process`` span, and a ``settle`` span under it.

        The span of an attempt that ran elsewhere (a worker that died: the supervisor
        tells) is recorded here, from when the attempt began.
        """
        kept = self._open.pop((claim.id, claim.attempt), None)
        if kept is not None:
            span, settle_started = kept
        else:
            span = self._processing(claim, int(settled.started_at.timestamp() * 1e9))
            settle_started = None
        failed = settled.outcome in FAILED_OUTCOMES
        error_type = type(settled.error).__qualname__ if failed and settled.error else None
        span.set_attribute("messaging.brooq.outcome", settled.outcome)
        if error_type:
            span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, _described(settled.error)))
        settle = self.tracer.start_span(
            f"settle {claim.topic}",
            context=trace.set_span_in_context(span),
            kind=SpanKind.CLIENT,
            attributes={
                **_destination(claim),
                "messaging.operation.type": "settle",
                "messaging.operation.name": settled.outcome,
                "messaging.brooq.outcome": settled.outcome,
                **({"error.type": error_type} if error_type else {}),
            },
            start_time=settle_started,
        )
        settle.end()
        span.end()

    def process_exit(self) -> None:
        """Flush the spans the provider holds (a worker leaves through ``os._exit``)."""
        provider = self.provider or trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)
        if flush is not None:
            flush(5000)

    def _processing(self, claim: Claim, start_time: int | None) -> Span:
        """The ``process`` span of an attempt (started at ``start_time``, ns; None: now)."""
        remote = _remote(claim.trace_context)
        linked = remote is not None and not self.parent
        context = Context()  # never the worker's own current span: a job is its own work
        if remote is not None and self.parent:
            context = trace.set_span_in_context(trace.NonRecordingSpan(remote), context)
        return self.tracer.start_span(
            f"process {claim.topic}",
            context=context,
            kind=SpanKind.CONSUMER,
            attributes={
                **_destination(claim),
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.brooq.attempt": claim.attempt,
            },
            links=[Link(remote)] if linked and remote is not None else None,
            start_time=start_time,
        )

    def _keep(self, claim: Claim, span: Span) -> None:
        """Keep ``span`` open until the attempt's outcome is known (``settled``)."""
        if len(self._open) >= MAX_OPEN:  # settles that never came: end the oldest
            oldest = next(iter(self._open))
            self._open.pop(oldest)[0].end()
        self._open[(claim.id, claim.attempt)] = (span, time.time_ns())


def _remote(carrier: Mapping[str, str] | None) -> trace.SpanContext | None:
    """The span context a job's stored trace context names (None: none, or not valid)."""
    if not carrier:
        return None
    found = trace.get_current_span(propagate.extract(carrier, context=Context()))
    context = found.get_span_context()
    return context if context.is_valid else None


def _destination(claim: Claim) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": claim.topic,
        "messaging.message.id": claim.id,
    }


def _sent(span: Span, done: list[Enqueued]) -> None:
    """The id of a single job enqueued, on its send span."""
    if len(done) == 1:
        span.set_attribute("messaging.message.id", done[0].id)


def _described(error: BaseException | None) -> str:
    try:
        return f"{type(error).__name__}: {error}"[:500]
    except BaseException:  # a broken __str__ must not lose the span
        return type(error).__name__


__all__ = ["Tracing"]
