"""What a rate-limited topic costs the others (issue 25): the largest drain, alone and while a
limited topic is served by the same workers.

Method: the drain of ``benchmarks/drain.py`` (a real ``brooq supervise --workers N``, ready
before the jobs are loaded in one statement; the clock runs from that commit until every
``bench.noop`` job is done), twice, adjacent in a round and in rotating order:

- **alone**: ``benchmarks.apps:queue``, the unlimited topic only (the drain as it is);
- **with a limited topic**: ``benchmarks.ratelimit:queue``, the same topic and
  ``bench.limited`` (``rate_limit="100/s"``, burst 10) on the same workers, with a backlog
  of limited jobs loaded just before the drain's, larger than the drain can start. Its
  claims run under the topic's lock and spend its bucket on every other refill, and its
  jobs share the workers, at most 100 a second.

The figure is the unlimited drain's jobs/s; the ratio with-limited / alone is the loss
(target: at most 10%). How many limited jobs started during the drain is a note, checked
against the bucket (burst + rate × seconds).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg

import brooq
from benchmarks.harness import (
    TOPIC,
    Context,
    Ratio,
    Sizes,
    SupervisorProcess,
    count,
    load_ready_jobs,
)

GROUP = "rate limits (issue 25): the largest drain while a rate-limited topic is served"
LIMITED = "bench.limited"
RATE, BURST = 100, 10
BACKLOG = 2_000
"""Limited jobs loaded before each drain: more than 100/s can start while it runs."""

queue = brooq.Queue(os.environ.get("DATABASE_URL", ""))


@queue.kind(TOPIC)
def noop(claim: brooq.Claim) -> None:
    """Nothing, as benchmarks.apps:queue's."""


@queue.kind(LIMITED, rate_limit=f"{RATE}/s", rate_burst=BURST)
def limited(claim: brooq.Claim) -> None:
    """Nothing; at most 100 start a second, over every supervisor."""


def ratios(sizes: Sizes) -> list[Ratio]:
    """The loss: the drain with the limited topic served / the drain alone."""
    n = sizes.max_workers
    return [
        Ratio(
            f"drain N={n}: with a 100/s limited topic served too / alone",
            f"ratelimit.with_limited.N{n}",
            f"ratelimit.alone.N{n}",
        )
    ]


def drain(ctx: Context, app: str, workers: int, jobs: int, backlog: int) -> tuple[float, int]:
    """Seconds to drain ``jobs`` unlimited jobs (``backlog`` limited ones loaded first), and
    how many limited jobs started meanwhile."""
    label = "limited" if backlog else "alone"
    with ctx.server.fresh(f"rate{label}{workers}") as dsn:
        sup = SupervisorProcess(dsn, app, workers, ctx.sizes.poll_interval, ctx.workdir).start()
        try:
            sup.wait_ready()
            with psycopg.connect(dsn, autocommit=True) as conn:
                if backlog:
                    load_limited(conn, backlog)
                load_ready_jobs(conn, jobs)
                started = time.perf_counter()
                seconds = wait_topic_done(conn, jobs, started, sup.alive)
                took = count(conn, f"topic = '{LIMITED}' AND state <> 'pending'")
            return seconds, took
        finally:
            sup.stop()


def load_limited(conn: psycopg.Connection[Any], jobs: int) -> None:
    """``jobs`` ready limited jobs in one statement, and NOTIFY."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO job (topic, payload) SELECT %s, to_jsonb(i) FROM generate_series(1, %s) i",
            (LIMITED, jobs),
        )
        conn.execute("SELECT pg_notify('brooq_job', %s)", (LIMITED,))


def wait_topic_done(
    conn: psycopg.Connection[Any],
    expected: int,
    started: float,
    alive: Callable[[], bool],
    stall_s: float = 60.0,
) -> float:
    """Poll every 50 ms until ``expected`` unlimited jobs are done; elapsed seconds."""
    last, last_change = -1, time.perf_counter()
    while True:
        done = count(conn, f"topic = '{TOPIC}' AND state = 'done'")
        now = time.perf_counter()
        if done >= expected:
            return now - started
        if done != last:
            last, last_change = done, now
        elif now - last_change > stall_s or not alive():
            raise RuntimeError(f"the drain stopped at {done} of {expected} done")
        time.sleep(0.05)


def _alone(ctx: Context, round_no: int, n: int) -> None:
    jobs = ctx.sizes.drain_jobs
    seconds, _ = drain(ctx, "benchmarks.apps:queue", n, jobs, 0)
    ctx.results.add(
        f"ratelimit.alone.N{n}",
        jobs / seconds,
        round_no=round_no,
        group=GROUP,
        label=f"brooq --workers {n}, {jobs:,} unlimited jobs alone",
        unit="jobs/s",
    )


def _with_limited(ctx: Context, round_no: int, n: int) -> None:
    jobs = ctx.sizes.drain_jobs
    seconds, took = drain(ctx, "benchmarks.ratelimit:queue", n, jobs, BACKLOG)
    ctx.results.add(
        f"ratelimit.with_limited.N{n}",
        jobs / seconds,
        round_no=round_no,
        group=GROUP,
        label=f"the same, {LIMITED} ({RATE}/s, {BACKLOG:,} waiting) on the same workers",
        unit="jobs/s",
    )
    # The limited jobs started while the clock ran (a few more after it stopped): the bucket
    # allows BURST + RATE × seconds, plus what one more poll interval let through.
    allowed = BURST + RATE * (seconds + 0.2)
    ctx.results.notes[f"ratelimit round {round_no + 1}"] = (
        f"{took} limited jobs claimed during a {seconds:.2f}s drain (the bucket allows "
        f"{allowed:.0f}){'' if took <= allowed else ': MORE THAN THE LIMIT'}"
    )


def run_round(ctx: Context, round_no: int) -> None:
    """The largest N: alone and with the limited topic, adjacent, order rotated per round."""
    n = ctx.sizes.max_workers
    steps = [
        (f"ratelimit.alone.N{n}", partial(_alone, ctx, round_no, n)),
        (f"ratelimit.with_limited.N{n}", partial(_with_limited, ctx, round_no, n)),
    ]
    shift = round_no % len(steps)
    for where, step in steps[shift:] + steps[:shift]:
        ctx.guarded(f"round {round_no + 1} {where}", step)
