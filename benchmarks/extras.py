"""What each per-job extra costs in a worker: µs of CPU per job, each call timed as the worker
makes it.

A fresh interpreter set up like a worker of ``brooq supervise`` in the
drain (``LOG_FORMAT=json``, ``LOG_LEVEL=info``, stderr into a file;
prometheus_client in multiprocess mode under a worker's metrics id) makes,
``extras_calls`` times each, the calls a worker makes per job
(brooq/supervisor/child.py, ``Worker.execute``), on a no-op job run once
through brooq's executor:

- ``logs_on``: ``LoggingListener(every_job=True)``'s ``claimed`` and
  ``settled``: the two log lines of ``QUEUE_LOG_JOBS=true``;
- ``logs_default``: the same calls at the default (``QUEUE_LOG_JOBS=false``:
  a done job is logged at DEBUG, i.e. not at all at INFO);
- ``metrics``: ``brooq_attempt_duration_seconds.labels(topic=…).observe(…)``;
- ``title``: the process title of the job (setproctitle).

Each is timed with ``time.thread_time_ns()`` around a batch of calls, less
an empty loop's time, in 5 batches per extra interleaved with the others;
the figure is the median batch. Its share of a worker's CPU per job is a
ratio against ``cpu.brooq.workers_cpu`` of the same round (ms per 1,000
jobs = µs per job; the no-op drain at the largest N).

    python -m benchmarks.extras CALLS    prints {"logs_on": µs, …} as JSON
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

from benchmarks.harness import ROOT, TOPIC, Context

GROUP = "per-job extras in a worker (µs of CPU per job; each call timed as the worker makes it)"
BATCHES = 5
LABELS = {
    "logs_on": "the two log lines, QUEUE_LOG_JOBS=true (JobClaimed, JobDone as JSON)",
    "logs_default": "the same calls at the default QUEUE_LOG_JOBS=false",
    "metrics": "prometheus histogram observe (brooq_attempt_duration_seconds)",
    "title": "process title (setproctitle)",
    "default_total": "together at the default: logs (off) + metrics + title",
    "logs_on_total": "together with QUEUE_LOG_JOBS=true: logs + metrics + title",
}


def _calls() -> dict[str, Callable[[], object]]:
    """The calls, set up as in a worker; the metrics directory is left for the caller."""
    from benchmarks.apps import queue
    from brooq import metrics as prom
    from brooq import osproc
    from brooq.engine.executor import Executor
    from brooq.engine.runner import Attempted
    from brooq.engine.store import Claimed, Ticket
    from brooq.logs import LoggingListener, setup_logging

    setup_logging("json", "info")
    prom.set_identity("w0")
    metrics = prom.Metrics()
    executor = Executor(queue.registry)
    claimed = Claimed(
        Ticket(str(uuid.uuid4()), "bench:extras", 1),
        TOPIC,
        '{"i": 1}',
        datetime.now(UTC) + timedelta(minutes=5),
    )
    executed = executor.run(claimed)
    options = executor.options(claimed)
    attempted = Attempted(claimed, executed.outcome, None, 0.0001)
    loud, quiet = LoggingListener(every_job=True), LoggingListener(every_job=False)
    histogram = metrics.duration

    def logs(listener: LoggingListener) -> Callable[[], object]:
        def call() -> None:
            listener.claimed(claimed, options)
            listener.settled(attempted)

        return call

    return {
        "logs_on": logs(loud),
        "logs_default": logs(quiet),
        "metrics": lambda: histogram.labels(topic=claimed.topic).observe(0.0001),
        "title": lambda: osproc.title(
            f"brooq worker 1: {claimed.topic} job {claimed.id} attempt {claimed.attempt}"
        ),
    }


def _batch_ns(call: Callable[[], object], n: int) -> int:
    started = time.thread_time_ns()
    for _ in range(n):
        call()
    return time.thread_time_ns() - started


def measure(calls: int) -> dict[str, float]:
    """µs of CPU per call of each extra (median of interleaved batches, less an empty call)."""
    from brooq import metrics as prom

    directory = prom.create_directory()
    try:
        extras = _calls()
        per_batch = max(1, calls // BATCHES)
        samples: dict[str, list[float]] = {name: [] for name in ["empty", *extras]}
        for b in range(BATCHES):
            names = list(samples)
            names = names[b % len(names) :] + names[: b % len(names)]
            for name in names:
                call = extras.get(name, lambda: None)
                samples[name].append(_batch_ns(call, per_batch) / per_batch / 1000)
        empty = statistics.median(samples.pop("empty"))
        return {name: max(0.0, statistics.median(v) - empty) for name, v in samples.items()}
    finally:
        prom.remove_directory(directory)


def run_round(ctx: Context, round_no: int) -> None:
    """Time the extras in a fresh worker-like process; record µs per job of each."""

    def one() -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "LOG_"))}
        env["PYTHONPATH"] = str(ROOT)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        log = ctx.workdir / f"extras-{os.getpid()}-{round_no}.log"
        with open(log, "wb") as err:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.extras", str(ctx.sizes.extras_calls)],
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                cwd=ctx.workdir,
                timeout=300,
            )
        if done.returncode != 0:
            raise RuntimeError(f"benchmarks.extras failed:\n{log.read_text()[-2000:]}")
        us = json.loads(done.stdout)
        us["default_total"] = us["logs_default"] + us["metrics"] + us["title"]
        us["logs_on_total"] = us["logs_on"] + us["metrics"] + us["title"]
        for name, value in us.items():
            ctx.results.add(
                f"extras.{name}.us",
                value,
                round_no=round_no,
                group=GROUP,
                label=LABELS[name],
                unit="µs/job",
                higher_is_better=False,
            )

    ctx.guarded(f"round {round_no + 1} extras", one)


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]))))
