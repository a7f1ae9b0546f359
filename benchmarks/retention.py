"""Retention: deleting 1,000,000 terminal rows with brooq's Retention service.

A fresh database gets 1,000,000 ``done`` rows with ``updated_at`` 40 days
ago (bulk ``generate_series``) and 50,000 ready rows, then ANALYZE.
``brooq.engine.retention.Retention`` over a ``PostgresStore`` (TTL 30 days,
batch 1,000, the default ``QUEUE_RETENTION_BATCH``) runs ``run_once`` until it
reports no backlog (each call stops after 100 batches, so it loops): rows/s.
A separate process claims ready rows (brooq's ``claim_topic``, autocommit) at
~200/s the whole time and times every claim: p99 for the seconds before
retention starts and while it runs.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks.harness import TOPIC, Context, count, percentile

GROUP = "retention (terminal rows older than the TTL)"
CLAIM_RATE = 200.0
LOAD_TERMINAL = (
    "INSERT INTO job (topic, payload, state, attempts, created_at, updated_at) "
    "SELECT %(topic)s, jsonb_build_object('i', i), 'done', 1, "
    "       now() - interval '40 days' + make_interval(secs => i / 1000.0), "
    "       now() - interval '40 days' + make_interval(secs => i / 1000.0) "
    "FROM generate_series(1, %(n)s) AS i"
)
LOAD_READY = (
    "INSERT INTO job (topic, payload) "
    "SELECT %(topic)s, jsonb_build_object('i', i) FROM generate_series(1, %(n)s) AS i"
)


def claimer(dsn: str, rate: float, ready: Any, stop: Any, out: Any) -> None:
    """Claim at ``rate``/s until ``stop``; send back ``[(monotonic start, ms, found)]``."""
    from brooq.postgres.sql import sql

    samples: list[tuple[float, float, bool]] = []
    params = {
        "holder": "bench:claimer",
        "lease": timedelta(minutes=5),
        "topic": TOPIC,
        "limit": 1,
        "app_version": None,
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        statement = sql("claim_topic")
        conn.execute(statement, params)  # warm: connection, prepared plan
        ready.set()
        due = time.monotonic()
        while not stop.is_set():
            t0 = time.monotonic()
            row = conn.execute(statement, params).fetchone()
            samples.append((t0, (time.monotonic() - t0) * 1000, row is not None))
            due += 1 / rate
            time.sleep(max(0.0, due - time.monotonic()))
    out.put(samples)


def measure(ctx: Context, dsn: str) -> dict[str, float]:
    """Load, start the claimer, run retention to the end; the figures."""
    from brooq.engine.retention import Retention
    from brooq.engine.timer import Every
    from brooq.postgres.store import PostgresStore

    sizes = ctx.sizes
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LOAD_TERMINAL, {"topic": TOPIC, "n": sizes.retention_rows})
        conn.execute(LOAD_READY, {"topic": TOPIC, "n": sizes.retention_claim_rows})
        conn.execute("ANALYZE job")
    spawn = mp.get_context("spawn")
    ready, stop, out = spawn.Event(), spawn.Event(), spawn.Queue()
    proc = spawn.Process(target=claimer, args=(dsn, CLAIM_RATE, ready, stop, out), daemon=True)
    proc.start()
    store = PostgresStore(dsn)
    logging.getLogger("brooq.retention").setLevel(logging.ERROR)  # no backlog warnings
    try:
        if not ready.wait(60):
            raise RuntimeError("the claimer did not start")
        time.sleep(sizes.retention_baseline_s)
        retention = Retention(store, timedelta(days=30), sizes.retention_batch, Every(timedelta(0)))
        deleted = 0
        began = time.monotonic()
        while True:
            deleted += sum(n for _, n in retention.run_once())
            if not retention.backlog:
                break
        ended = time.monotonic()
        stop.set()
        samples: list[tuple[float, float, bool]] = out.get(timeout=60)
        proc.join(30)
    finally:
        store.close()
        stop.set()
        if proc.is_alive():
            proc.kill()
    if deleted != sizes.retention_rows:
        raise RuntimeError(f"retention deleted {deleted} rows, expected {sizes.retention_rows}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        if count(conn, "state = 'done'"):
            raise RuntimeError("terminal rows left after retention")
    before = [ms for t, ms, _ in samples if t < began]
    during = [ms for t, ms, _ in samples if began <= t < ended]
    if not all(found for t, _, found in samples if t < ended):
        raise RuntimeError("the claimer ran out of ready rows; raise retention_claim_rows")
    if not before or not during:
        raise RuntimeError(f"too few claims timed ({len(before)} before, {len(during)} during)")
    return {
        "rows_per_s": deleted / (ended - began),
        "seconds": ended - began,
        "p50_before": percentile(before, 50),
        "p99_before": percentile(before, 99),
        "p50_during": percentile(during, 50),
        "p99_during": percentile(during, 99),
    }


def run_round(ctx: Context, round_no: int) -> None:
    """One retention run."""

    def one() -> None:
        with ctx.server.fresh("retention") as dsn:
            got = measure(ctx, dsn)
        b = ctx.sizes.retention_batch
        add = ctx.results.add
        add(
            "retention.rows_per_s",
            got["rows_per_s"],
            round_no=round_no,
            group=GROUP,
            label=f"Retention.run_once loop, batch {b:,}, {ctx.sizes.retention_rows:,} rows",
            unit="rows/s",
        )
        for when, words in (("before", "before retention"), ("during", "while retention runs")):
            for pct in ("p50", "p99"):
                add(
                    f"retention.claim_{pct}_{when}",
                    got[f"{pct}_{when}"],
                    round_no=round_no,
                    group=GROUP,
                    label=f"concurrent claim {pct}, {words}",
                    unit="ms",
                    higher_is_better=False,
                )

    ctx.guarded(f"round {round_no + 1} retention", one)
