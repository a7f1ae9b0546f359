"""What middleware costs per job: none registered, one pass-through, and tracing.

A fresh interpreter runs a no-op job through brooq's executor as a worker
does (``Executor.run``, then ``Executor.settled``), ``middleware_calls``
times per figure, and enqueues through the middleware stack into a write that
does nothing (the database's part of an enqueue is the same with or without
middleware):

- ``none``: what a job pays when no middleware is registered: the checks the
  executor and the queue make per job (``if middleware``, the ``settled``
  hook list, the ``enqueue`` hook list), timed as they run;
- ``executor``: the whole run of a no-op job without middleware, for scale;
- ``one``: one pass-through middleware defining ``enqueue``, ``run`` and
  ``settled``: a job's enqueue and run with it, less the same without;
- ``tracing``: ``brooq.otel.Tracing`` with the OpenTelemetry SDK (a
  ``SimpleSpanProcessor`` into an exporter that drops the spans): the send
  span and the trace context at enqueue, the process and settle spans at the
  run, less the same without; its ``tracing_enqueue`` and ``tracing_run``
  halves are reported too. Measured only where the SDK is installed (the dev
  install has it).

Each is timed with ``time.thread_time_ns()`` around a batch of calls, less an
empty loop's, in 5 batches interleaved with the others; the figure is the
median batch, in µs of CPU per job.

    python -m benchmarks.middleware CALLS    prints {"none": µs, …} as JSON
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.harness import ROOT, Context

GROUP = "middleware per job (µs of CPU per job; no-op job, timed call by call)"
BATCHES = 5
TOPIC = "bench.middleware"
LABELS = {
    "none": "no middleware registered: the per-job checks (run, settled, enqueue)",
    "executor": "a no-op job's run in the executor without middleware (for scale)",
    "one": "one pass-through middleware (enqueue + run + settled), added",
    "tracing_enqueue": "tracing at enqueue: send span + trace context, added",
    "tracing_run": "tracing at the run: process + settle spans, added",
    "tracing": "tracing, enqueue and run together, added",
}


def _noop(claim: Any) -> None:
    """The job: nothing."""


def _calls() -> dict[str, Callable[[], object]]:
    """Every timed call, set up as a worker and an enqueuing app have them."""
    import brooq
    from brooq.engine.executor import Executor
    from brooq.engine.kinds import Registry
    from brooq.engine.store import Claimed, Ticket
    from brooq.vocabulary import Enqueued, Job, KindOptions

    def executor(*middleware: Any) -> Executor:
        registry = Registry()
        registry.register(TOPIC, _noop, KindOptions())
        for item in middleware:
            registry.middleware.add(item)
        return Executor(registry)

    claimed = Claimed(
        Ticket(str(uuid.uuid4()), "bench:middleware", 1),
        TOPIC,
        '{"i": 1}',
        datetime.now(UTC) + timedelta(minutes=5),
    )
    job = Job(TOPIC, {"i": 1})
    written = [Enqueued(claimed.id, True)]

    def write(jobs: list[Job]) -> list[Enqueued]:
        return written

    def job_through(ex: Executor) -> Callable[[], object]:
        stack = ex.kinds.middleware

        def call() -> None:
            if stack.by_hook["enqueue"]:
                stack.enqueue([job], write)
            else:
                write([job])
            executed = ex.run(claimed)
            ex.settled(executed, executed.outcome, None)

        return call

    class PassThrough(brooq.Middleware):
        def enqueue(self, jobs: Any, call_next: Any) -> Any:
            return call_next(jobs)

        def run(self, claim: Any, call_next: Any) -> Any:
            return call_next(claim)

        def settled(self, claim: Any, settled: Any) -> None:
            pass

    plain = executor()
    executed = plain.run(claimed)
    stack = plain.kinds.middleware

    def checks() -> None:
        bool(stack)  # Executor._call
        plain.settled(executed, executed.outcome, None)  # returns at once
        bool(stack.by_hook["enqueue"])  # Queue.enqueue_many

    def run_plain() -> None:
        done = plain.run(claimed)
        plain.settled(done, done.outcome, None)

    calls: dict[str, Callable[[], object]] = {
        "none": checks,
        "run_plain": run_plain,
        "enqueue_plain": lambda: write([job]),
        "base": job_through(plain),
        "one": job_through(executor(PassThrough())),
    }
    calls.update(_tracing_calls(executor(), job, write, claimed))
    return calls


def _tracing_calls(
    plain: Any, job: Any, write: Callable[..., Any], claimed: Any
) -> dict[str, Callable[[], object]]:
    """The tracing figures' calls (none when the OpenTelemetry SDK is not installed)."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        from brooq.otel import Tracing
    except ImportError:
        return {}
    from brooq.engine.executor import Executor

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    tracing = Tracing(tracer_provider=provider)
    registry = plain.kinds
    registry.middleware.add(tracing)
    traced = Executor(registry)
    stack = registry.middleware
    stamped: list[Any] = []

    def keep(jobs: list[Any]) -> Any:
        stamped[:] = jobs
        return write(jobs)

    stack.enqueue([job], keep)
    with_context = _with_trace(claimed, stamped[0].trace_context)

    def enqueue() -> None:
        stack.enqueue([job], write)

    def run() -> None:
        executed = traced.run(with_context)
        traced.settled(executed, executed.outcome, None)

    return {"tracing_enqueue": enqueue, "tracing_run": run}


def _with_trace(claimed: Any, carrier: Any) -> Any:
    """``claimed`` carrying the trace context an enqueue stored."""
    import dataclasses

    return dataclasses.replace(claimed, trace_context=json.dumps(carrier))


def _batch_ns(call: Callable[[], object], n: int) -> int:
    started = time.thread_time_ns()
    for _ in range(n):
        call()
    return time.thread_time_ns() - started


def measure(calls: int) -> dict[str, float]:
    """µs of CPU per job of each figure (median of interleaved batches, less an empty call)."""
    timed = _calls()
    per_batch = max(1, calls // BATCHES)
    samples: dict[str, list[float]] = {name: [] for name in ["empty", *timed]}
    for b in range(BATCHES):
        names = list(samples)
        names = names[b % len(names) :] + names[: b % len(names)]
        for name in names:
            call = timed.get(name, lambda: None)
            samples[name].append(_batch_ns(call, per_batch) / per_batch / 1000)
    us = {name: statistics.median(v) for name, v in samples.items()}
    out = {
        "none": max(0.0, us["none"] - us["empty"]),
        "executor": max(0.0, us["run_plain"] - us["empty"]),
        "one": max(0.0, us["one"] - us["base"]),
    }
    if "tracing_run" in us:
        out["tracing_enqueue"] = max(0.0, us["tracing_enqueue"] - us["enqueue_plain"])
        out["tracing_run"] = max(0.0, us["tracing_run"] - us["run_plain"])
        out["tracing"] = out["tracing_enqueue"] + out["tracing_run"]
    return out


def run_round(ctx: Context, round_no: int) -> None:
    """Time the figures in a fresh process; record µs per job of each."""

    def one() -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "LOG_"))}
        env["PYTHONPATH"] = str(ROOT)
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.middleware", str(ctx.sizes.middleware_calls)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ctx.workdir,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"benchmarks.middleware failed:\n{done.stderr[-2000:]}")
        for name, value in json.loads(done.stdout).items():
            ctx.results.add(
                f"middleware.{name}.us",
                value,
                round_no=round_no,
                group=GROUP,
                label=LABELS[name],
                unit="µs/job",
                higher_is_better=False,
            )

    ctx.guarded(f"round {round_no + 1} middleware", one)


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]))))
