"""The apps the benchmarks supervise (``--app benchmarks.apps:queue`` / ``:cpu`` / ``:latency``).

Each Queue has exactly one kind, so its workers claim with the one-topic
statement (``claim_topic``), the common case.

- ``queue``: ``bench.noop``, a handler that does nothing.
- ``results``: ``bench.noop`` again, returning a dict of about 100 bytes (stored).
- ``cpu``: ``bench.cpu``, a handler that spins ``BENCH_CPU_MS`` milliseconds
  of its own thread's CPU (``time.thread_time()``), as every system's
  CPU-bound handler does.
- ``latency``: ``bench.latency``, a handler that takes ``time.time()`` first
  thing and writes it, with the job id, into ``bench_latency`` in the settle
  transaction (``on_succeeded``). The producer subtracts its commit time.
"""

from __future__ import annotations

import os
import time
from typing import Any

import brooq

CPU_TOPIC = "bench.cpu"
CPU_MS = float(os.environ.get("BENCH_CPU_MS", "2"))

queue = brooq.Queue(os.environ.get("DATABASE_URL", ""))
results = brooq.Queue(os.environ.get("DATABASE_URL", ""))
cpu = brooq.Queue(os.environ.get("DATABASE_URL", ""))
latency = brooq.Queue(os.environ.get("DATABASE_URL", ""))

LATENCY_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_latency "
    "(job_id uuid PRIMARY KEY, started double precision NOT NULL)"
)


def spin(ms: float) -> None:
    """Spend ``ms`` milliseconds of this thread's CPU (waiting for a CPU does not count)."""
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


@queue.kind("bench.noop")
def noop(claim: brooq.Claim) -> None:
    """Nothing: what is left is the queue's own cost."""


RESULT = {"status": "ok", "rows": 42, "note": "a small result of about a hundred bytes"}


@results.kind("bench.noop")
def noop_with_result(claim: brooq.Claim) -> dict[str, object]:
    """Nothing, and a small dict as its result (stored with the job)."""
    return RESULT


@cpu.kind(CPU_TOPIC)
def burn(claim: brooq.Claim) -> None:
    """``BENCH_CPU_MS`` of CPU: a CPU-bound job, the same in every system measured."""
    spin(CPU_MS)


@latency.kind("bench.latency")
def record_start(claim: brooq.Claim) -> None:
    """Record when the handler started (wall clock, comparable with the producer's)."""
    started = time.time()

    def write(conn: Any) -> None:
        conn.execute(
            "INSERT INTO bench_latency (job_id, started) VALUES (%s, %s)", (claim.id, started)
        )

    claim.on_succeeded(write)
