"""The apps the benchmarks supervise (``--app benchmarks.apps:queue`` / ``:latency``).

Each Queue has exactly one kind, so its workers claim with the one-topic
statement (``claim_topic``), the common case.

- ``queue``: ``bench.noop``, a handler that does nothing.
- ``latency``: ``bench.latency``, a handler that takes ``time.time()`` first
  thing and writes it, with the job id, into ``bench_latency`` in the settle
  transaction (``on_succeeded``). The producer subtracts its commit time.
"""

from __future__ import annotations

import os
import time
from typing import Any

import brooq

queue = brooq.Queue(os.environ.get("DATABASE_URL", ""))
latency = brooq.Queue(os.environ.get("DATABASE_URL", ""))

LATENCY_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_latency "
    "(job_id uuid PRIMARY KEY, started double precision NOT NULL)"
)


@queue.kind("bench.noop")
def noop(claim: brooq.Claim) -> None:
    """Nothing: what is left is the queue's own cost."""


@latency.kind("bench.latency")
def record_start(claim: brooq.Claim) -> None:
    """Record when the handler started (wall clock, comparable with the producer's)."""
    started = time.time()

    def write(conn: Any) -> None:
        conn.execute(
            "INSERT INTO bench_latency (job_id, started) VALUES (%s, %s)", (claim.id, started)
        )

    claim.on_succeeded(write)
