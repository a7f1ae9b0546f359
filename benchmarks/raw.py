"""The raw floor and ceiling of draining: P plain psycopg processes, no framework.

Each worker is a spawned process with one autocommit connection that loops
until a claim comes back empty (a statement that deadlocks is run again, and
counted):

- ``two``: claim one job (brooq's own ``claim_topic`` statement, loaded from
  queries.sql, with a limit of 1) then settle (``UPDATE … SET state = 'done'``
  guarded like brooq's settle): two statements, two commits per job. The
  floor the brief names.
- ``fused``: settle one job and claim the next in one statement (brooq's
  per-worker hot path before the supervisor claimed in batches): one
  statement, one commit per job.
- ``batch``: the same claim for 10 rows per statement and one settle
  statement for those 10 rows: the batched ceiling.

With ``cpu_ms`` (the CPU-bound workload), each job spins that much of the
worker's own thread CPU between its claim and its settle, like every
system's CPU-bound handler (benchmarks/apps.py's ``spin``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks.apps import spin
from benchmarks.cpu import CpuProbe, CpuUsage, enable_wal_timing
from benchmarks.harness import TOPIC, count, load_ready_jobs, wait_done

LEASE = timedelta(minutes=5)

SETTLE = """
UPDATE job SET state = 'done', updated_at = now()
WHERE id = %(id)s AND state = 'processing' AND locked_by = %(holder)s AND attempts = %(attempt)s
"""

CLAIM_MANY = """
UPDATE job
SET state = 'processing', locked_by = %(holder)s, locked_until = now() + %(lease)s,
    attempts = attempts + 1, updated_at = now()
WHERE id = ANY(ARRAY(
    SELECT id FROM job
    WHERE state IN ('pending', 'failed') AND topic = %(topic)s AND available_at <= now()
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
))
RETURNING id, topic, payload, attempts, locked_until
"""

SETTLE_MANY = """
UPDATE job SET state = 'done', updated_at = now()
FROM unnest(%(ids)s::uuid[], %(attempts)s::int[]) AS held(id, attempt)
WHERE job.id = held.id AND job.state = 'processing' AND job.locked_by = %(holder)s
  AND job.attempts = held.attempt
"""

FUSED = """
WITH settled AS (
    UPDATE job
    SET state = %(state)s,
        attempts = GREATEST(attempts - %(refund)s, 0),
        available_at = CASE WHEN %(state)s = 'failed' THEN now() + %(retry_in)s
                            ELSE available_at END,
        last_error = COALESCE(%(error)s, last_error),
        updated_at = now()
    WHERE id = %(id)s AND state = 'processing' AND locked_by = %(holder)s
      AND attempts = %(attempt)s
    RETURNING 1
), claimed AS (
    UPDATE job
    SET state = 'processing', locked_by = %(holder)s, locked_until = now() + %(lease)s,
        attempts = attempts + 1, updated_at = now()
    WHERE id = (
        SELECT id FROM job
        WHERE state IN ('pending', 'failed') AND topic = %(topic)s AND available_at <= now()
        ORDER BY priority DESC, available_at, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    )
    RETURNING id, topic, payload, attempts, locked_until
)
SELECT (SELECT count(*) FROM settled) AS settled,
       claimed.id, claimed.topic, claimed.payload, claimed.attempts, claimed.locked_until
FROM (SELECT 1) AS one LEFT JOIN claimed ON true
"""

MODES = {
    "two": "claim + settle, 2 commits/job",
    "fused": "settle-and-claim statement, 1 commit/job",
    "batch": "10 rows per claim and per settle",
}


class Runner:
    """Runs statements on one autocommit connection, retrying (and counting) deadlocks.

    A statement that fails with deadlock_detected or serialization_failure
    was rolled back as a whole; running it again is what a real worker
    would do, and the count says how often it happened.
    """

    RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.deadlocks = 0

    def run(self, statement: str, params: dict[str, Any]) -> psycopg.Cursor[Any]:
        """``conn.execute`` until it does not deadlock."""
        while True:
            try:
                return self.conn.execute(statement, params)
            except self.RETRYABLE:
                self.deadlocks += 1


def _loop_two(db: Runner, params: dict[str, Any], cpu_ms: float) -> None:
    from brooq.postgres.sql import sql

    claim = sql("claim_topic")
    while True:
        row = db.run(claim, params).fetchone()
        if row is None:
            return
        if cpu_ms:
            spin(cpu_ms)
        db.run(SETTLE, {"id": row[0], "holder": params["holder"], "attempt": row[3]})


def _loop_fused(db: Runner, params: dict[str, Any]) -> None:
    from brooq.postgres.sql import sql

    row = db.run(sql("claim_topic"), params).fetchone()
    statement = FUSED
    fixed = {**params, "state": "done", "refund": 0, "retry_in": timedelta(0), "error": None}
    while row is not None:
        out = db.run(statement, {**fixed, "id": row[0], "attempt": row[3]}).fetchone()
        assert out is not None
        row = out[1:] if out[1] is not None else None


def _loop_batch(db: Runner, params: dict[str, Any], size: int, cpu_ms: float) -> None:
    while True:
        rows = db.run(CLAIM_MANY, {**params, "limit": size}).fetchall()
        if not rows:
            return
        if cpu_ms:
            for _ in rows:
                spin(cpu_ms)
        db.run(
            SETTLE_MANY,
            {
                "ids": [r[0] for r in rows],
                "attempts": [r[3] for r in rows],
                "holder": params["holder"],
            },
        )


def worker(
    dsn: str,
    mode: str,
    batch: int,
    cpu_ms: float,
    ready: Any,
    go: Any,
    stop: Any,
    finished: Any,
) -> None:
    """One raw worker process: connect, report ready, wait for go, drain, wait for stop.

    It stays (with its connection) until ``stop`` so that its CPU time, and its
    backend's, can still be read from /proc after the drain.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        params = {
            "holder": f"raw:{os.getpid()}",
            "lease": LEASE,
            "topic": TOPIC,
            "limit": 1,
            "app_version": None,
        }
        ready.put(os.getpid())
        go.wait()
        db = Runner(conn)
        if mode == "two":
            _loop_two(db, params, cpu_ms)
        elif mode == "fused":
            if cpu_ms:
                raise ValueError("the fused loop has no CPU-bound variant")
            _loop_fused(db, params)
        else:
            _loop_batch(db, params, batch, cpu_ms)
        finished.put(db.deadlocks)
        stop.wait(600)


@dataclass
class RawDrain:
    """What one raw drain measured."""

    seconds: float
    done_at_start: int
    cpu: CpuUsage
    deadlocks: int


def drain(
    dsn: str,
    mode: str,
    processes: int,
    jobs: int,
    batch: int = 10,
    wal: bool = False,
    cpu_ms: float = 0.0,
) -> RawDrain:
    """Start ``processes`` workers, load ``jobs`` rows, time from go until all are done."""
    if wal:
        enable_wal_timing(dsn)
    ctx = mp.get_context("spawn")
    ready, go, stop, finished = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=worker, args=(dsn, mode, batch, cpu_ms, ready, go, stop, finished), daemon=True
        )
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    try:
        pids = [ready.get(timeout=60) for _ in procs]
        with psycopg.connect(dsn, autocommit=True) as conn:
            load_ready_jobs(conn, jobs, notify=False)
            probe = CpuProbe(conn, {"workers": pids}, wal=wal)
            started = probe.started = time.perf_counter()
            go.set()
            done_at_start = count(conn, "state = 'done'")
            seconds = wait_done(conn, jobs, started, alive=lambda: all(p.is_alive() for p in procs))
            usage = probe.finish()
            deadlocks = sum(finished.get(timeout=60) for _ in procs)
            stop.set()
            for p in procs:
                p.join(30)
            probe.read_wal(usage)
        return RawDrain(seconds, done_at_start, usage, deadlocks)
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
