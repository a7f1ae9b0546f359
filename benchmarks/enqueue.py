"""Enqueue throughput: brooq one by one and in bulk, against plain psycopg into the same table.

Every variant runs in its own fresh database, opens its connection before the
clock starts, and commits every job (one by one) or every batch (bulk).

- ``enqueue.brooq`` / ``enqueue.brooq_nonotify``: ``Queue(dsn).enqueue(Job(…))``
  5,000 times, with NOTIFY (the default) and with ``notify=False``.
- ``enqueue.raw``: one ``INSERT INTO job (topic, payload) VALUES (…)`` per job,
  autocommit; the id comes from the column default (``brooq_uuid7()``).
- ``bulk.brooq``: ``Queue.enqueue_many`` of 1,000 jobs per call, 50,000 jobs.
- ``bulk.raw_unnest`` / ``bulk.raw_executemany`` / ``bulk.raw_copy``: the same
  batches with plain psycopg, each batch one transaction; the ratio is taken
  against whichever is fastest in that round.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg

from benchmarks.harness import TOPIC, Context, Results, count, warm

GROUP_SINGLE = "enqueue one by one"
GROUP_BULK = "bulk enqueue"
RAW_BULK = ("raw_unnest", "raw_executemany", "raw_copy")
RAW_BULK_LABELS = {
    "raw_unnest": "plain psycopg INSERT … SELECT unnest(%s::jsonb[])",
    "raw_executemany": "plain psycopg executemany INSERT (pipelined)",
    "raw_copy": "plain psycopg COPY job (topic, payload) FROM STDIN",
}


def _payload(i: int) -> dict[str, Any]:
    return {"i": i}


def brooq_single(dsn: str, jobs: int, notify: bool) -> float:
    """Seconds for ``jobs`` calls of ``Queue.enqueue`` on a DSN-backed queue."""
    import brooq

    queue = brooq.Queue(dsn, notify=notify)
    try:
        warm(queue)  # connect before the clock starts
        started = time.perf_counter()
        for i in range(jobs):
            queue.enqueue(brooq.Job(topic=TOPIC, payload=_payload(i)))
        return time.perf_counter() - started
    finally:
        queue.close()


def raw_single(dsn: str, jobs: int) -> float:
    """Seconds for ``jobs`` autocommit INSERTs of one row each."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        started = time.perf_counter()
        for i in range(jobs):
            conn.execute(
                "INSERT INTO job (topic, payload) VALUES (%s, %s::jsonb)",
                (TOPIC, json.dumps(_payload(i))),
            )
        return time.perf_counter() - started


def brooq_bulk(dsn: str, jobs: int, batch: int) -> float:
    """Seconds for ``jobs`` through ``Queue.enqueue_many`` in batches of ``batch``."""
    import brooq

    queue = brooq.Queue(dsn)
    try:
        warm(queue)
        started = time.perf_counter()
        for first in range(0, jobs, batch):
            queue.enqueue_many(
                [
                    brooq.Job(topic=TOPIC, payload=_payload(i))
                    for i in range(first, min(jobs, first + batch))
                ]
            )
        return time.perf_counter() - started
    finally:
        queue.close()


def raw_bulk(dsn: str, jobs: int, batch: int, how: str) -> float:
    """Seconds for ``jobs`` in batches with plain psycopg (``how``: one of RAW_BULK)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        started = time.perf_counter()
        for first in range(0, jobs, batch):
            payloads = [json.dumps(_payload(i)) for i in range(first, min(jobs, first + batch))]
            with conn.transaction():
                if how == "raw_unnest":
                    conn.execute(
                        "INSERT INTO job (topic, payload) "
                        "SELECT %s, p FROM unnest(%s::jsonb[]) AS p",
                        (TOPIC, payloads),
                    )
                elif how == "raw_executemany":
                    conn.cursor().executemany(
                        "INSERT INTO job (topic, payload) VALUES (%s, %s::jsonb)",
                        [(TOPIC, p) for p in payloads],
                    )
                else:
                    with conn.cursor().copy("COPY job (topic, payload) FROM STDIN") as copy:
                        for p in payloads:
                            copy.write_row((TOPIC, p))
        return time.perf_counter() - started


def _check(dsn: str, expected: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        got = count(conn, "true")
    if got != expected:
        raise RuntimeError(f"expected {expected} rows, found {got}")


def run_single(ctx: Context, round_no: int) -> None:
    """One round of one-by-one enqueue: brooq (NOTIFY on, off) and raw, order rotated."""
    n = ctx.sizes.enqueue_single
    variants: list[tuple[str, str, Any]] = [
        (
            "enqueue.brooq",
            f"brooq Queue.enqueue, NOTIFY on ({n:,} jobs)",
            lambda dsn: brooq_single(dsn, n, True),
        ),
        (
            "enqueue.brooq_nonotify",
            f"brooq Queue.enqueue, NOTIFY off ({n:,} jobs)",
            lambda dsn: brooq_single(dsn, n, False),
        ),
        (
            "enqueue.raw",
            f"raw floor: psycopg INSERT per job, autocommit ({n:,})",
            lambda dsn: raw_single(dsn, n),
        ),
    ]
    _run_variants(ctx, round_no, GROUP_SINGLE, variants, n)


def run_bulk(ctx: Context, round_no: int) -> None:
    """One round of bulk enqueue: brooq enqueue_many and three plain-psycopg ways."""
    n, b = ctx.sizes.enqueue_bulk, ctx.sizes.bulk_batch
    variants: list[tuple[str, str, Any]] = [
        (
            "bulk.brooq",
            f"brooq Queue.enqueue_many, {b:,}/call ({n:,} jobs)",
            lambda dsn: brooq_bulk(dsn, n, b),
        ),
    ]
    for how in RAW_BULK:
        variants.append(
            (
                f"bulk.{how}",
                f"raw: {RAW_BULK_LABELS[how]}, {b:,}/tx",
                lambda dsn, how=how: raw_bulk(dsn, n, b, how),
            )
        )
    _run_variants(ctx, round_no, GROUP_BULK, variants, n)


def _run_variants(
    ctx: Context, round_no: int, group: str, variants: list[tuple[str, str, Any]], jobs: int
) -> None:
    shift = round_no % len(variants)
    for key, label, fn in variants[shift:] + variants[:shift]:

        def one(key: str = key, label: str = label, fn: Any = fn) -> None:
            with ctx.server.fresh(key.replace(".", "_")) as dsn:
                seconds = fn(dsn)
                _check(dsn, jobs)
            ctx.results.add(
                key, jobs / seconds, round_no=round_no, group=group, label=label, unit="jobs/s"
            )

        ctx.guarded(f"round {round_no + 1} {key}", one)


def best_raw_bulk(results: Results) -> str | None:
    """The fastest plain-psycopg bulk way by median (the reference of the bulk ratio)."""
    medians = {k: m for how in RAW_BULK if (m := results.median(k := f"bulk.{how}")) is not None}
    return max(medians, key=lambda k: medians[k]) if medians else None
