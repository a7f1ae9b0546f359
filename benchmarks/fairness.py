"""Fair claiming (issue 34): a small tenant behind a big one, the drain of a fair topic, and
the fair claim's cost with many keys ready.

Method (each on a fresh database, a real ``brooq supervise --workers N`` at the largest N
where a supervisor runs, ready before any job is loaded):

- **pickup**: ``BIG`` ready jobs of key ``big`` are loaded in one statement; once the
  supervisor has started on them, ``SMALL`` jobs of key ``small`` are enqueued. Each small
  job's handler returns the wall clock as it starts; its pickup is that less its
  ``created_at`` (the database's clock, same machine). p50 and p99 over the small jobs, on
  the fair topic (``fairness="round_robin"``) and on a plain one (FIFO), with the same rows.
- **drain**: the drain's ``drain_jobs`` no-op jobs spread over ``DRAIN_KEYS`` keys, on the
  fair topic and on the plain one, adjacent in a round and in rotating order: jobs/s and
  the ratio fair / plain (target ≥ 0.9).
- **claim with many keys**: ``KEYS`` keys with ``PER_KEY`` ready rows each, ANALYZEd; one
  connection claims ``limit`` = 10 jobs ``CLAIMS`` times, each in a transaction of
  ``lock_fair_topic`` and the fair claim (``fair_walk`` and ``claim_fair_turns``, limited.py's
  ``claim_fair``) as a supervisor runs it, each timed with its commit; the plain
  ``claim_topic`` on the same rows for comparison.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from functools import partial
from typing import Any

import psycopg

import brooq
from benchmarks.harness import Context, Ratio, Sizes, SupervisorProcess, count, percentile

GROUP = "fairness (issue 34): a small tenant behind a big one; a fair drain; the fair claim"
FAIR, PLAIN = "bench.fair", "bench.fifo"
SMALL = 20
DRAIN_KEYS = 100
KEYS, PER_KEY, CLAIMS = 10_000, 10, 300

queue = brooq.Queue(os.environ.get("DATABASE_URL", ""))


@queue.kind(FAIR, fairness="round_robin")
def fair(claim: brooq.Claim) -> float | None:
    """Nothing; a small tenant's job returns when it started (its payload says which)."""
    return time.time() if claim.payload == "small" else None


@queue.kind(PLAIN)
def plain(claim: brooq.Claim) -> float | None:
    """The same, on a topic without fairness."""
    return time.time() if claim.payload == "small" else None


def big_jobs(sizes: Sizes) -> int:
    """The big tenant's backlog: 200,000 (20,000 with --quick)."""
    return 200_000 if sizes.drain_jobs >= 20_000 else 20_000


def ratios(sizes: Sizes) -> list[Ratio]:
    """Fair / plain: the drain (jobs/s) and the small tenant's pickup p99."""
    n = sizes.max_workers
    return [
        Ratio(f"drain N={n}: fair topic / plain topic", f"fair.drain.fair.N{n}",
              f"fair.drain.plain.N{n}"),
        Ratio(f"small tenant pickup p99: fair / FIFO (N={n})", f"fair.pickup.{FAIR}.p99",
              f"fair.pickup.{PLAIN}.p99"),
        Ratio(f"claim of 10 with {KEYS:,} keys ready: fair p50 / plain p50",
              "fair.claim.fair.p50", "fair.claim.plain.p50"),
    ]  # fmt: skip


def load(conn: psycopg.Connection[Any], topic: str, jobs: int, keys: int, payload: str) -> None:
    """``jobs`` ready jobs of ``topic`` over ``keys`` keys (``key-0``… or ``big`` for one), in
    one statement, and NOTIFY."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO job (topic, payload, rate_key) "
            "SELECT %(topic)s, to_jsonb(%(payload)s::text), "
            "       CASE WHEN %(keys)s = 1 THEN 'big' ELSE 'key-' || (i %% %(keys)s) END "
            "FROM generate_series(1, %(n)s) AS i",
            {"topic": topic, "payload": payload, "keys": keys, "n": jobs},
        )
        conn.execute("SELECT pg_notify('brooq_job', %s)", (topic,))


def pickup(ctx: Context, round_no: int, topic: str) -> None:
    """The small tenant's pickup behind the big one's backlog, on ``topic``."""
    n, big = ctx.sizes.max_workers, big_jobs(ctx.sizes)
    with ctx.server.fresh(f"pickup{topic.replace('.', '')}") as dsn:
        sup = SupervisorProcess(dsn, "benchmarks.fairness:queue", n, ctx.sizes.poll_interval,
                                ctx.workdir).start()  # fmt: skip
        try:
            sup.wait_ready()
            with psycopg.connect(dsn, autocommit=True) as conn:
                load(conn, topic, big, 1, "big")
                deadline = time.monotonic() + 60
                while count(conn, "state = 'done'") < 100 and time.monotonic() < deadline:
                    time.sleep(0.01)  # the big tenant's jobs are running
                store = brooq.Queue(conn).store
                store.enqueue_many([brooq.Job(topic, "small", rate_key="small")] * SMALL)
                waits = wait_small(conn, topic, sup.alive)
        finally:
            sup.stop()
    for name, pct in (("p50", 50), ("p99", 99)):
        ctx.results.add(f"fair.pickup.{topic}.{name}", percentile(waits, pct) * 1000,
                        round_no=round_no, group=GROUP,
                        label=f"{topic}: {SMALL} small-tenant jobs behind {big:,} of a big one "
                              f"(N={n}): pickup {name}",
                        unit="ms", higher_is_better=False)  # fmt: skip


def wait_small(conn: psycopg.Connection[Any], topic: str, alive: Any) -> list[float]:
    """Seconds from enqueue to start of each small job, once all are done (bounded wait)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and alive():
        rows = conn.execute(
            "SELECT (result #>> '{}')::float8 - EXTRACT(EPOCH FROM created_at) FROM job "
            "WHERE topic = %s AND rate_key = 'small' AND state = 'done'",
            (topic,),
        ).fetchall()
        if len(rows) == SMALL:
            return [max(0.0, r[0]) for r in rows]
        time.sleep(0.05)
    raise RuntimeError(f"the small tenant's jobs of {topic} did not all start")


def drain(ctx: Context, round_no: int, topic: str) -> None:
    """Jobs/s of a drain of ``topic`` over DRAIN_KEYS keys."""
    n, jobs = ctx.sizes.max_workers, ctx.sizes.drain_jobs
    with ctx.server.fresh(f"fdrain{topic.replace('.', '')}") as dsn:
        sup = SupervisorProcess(dsn, "benchmarks.fairness:queue", n, ctx.sizes.poll_interval,
                                ctx.workdir).start()  # fmt: skip
        try:
            sup.wait_ready()
            with psycopg.connect(dsn, autocommit=True) as conn:
                load(conn, topic, jobs, DRAIN_KEYS, "x")
                started = time.perf_counter()
                deadline = started + 300
                while count(conn, "state = 'done'") < jobs:
                    if time.perf_counter() > deadline or not sup.alive():
                        raise RuntimeError(f"the drain of {topic} stopped")
                    time.sleep(0.05)
                seconds = time.perf_counter() - started
        finally:
            sup.stop()
    which = "fair" if topic == FAIR else "plain"
    ctx.results.add(f"fair.drain.{which}.N{n}", jobs / seconds, round_no=round_no, group=GROUP,
                    label=f"drain of {jobs:,} no-op jobs over {DRAIN_KEYS} keys, {topic} (N={n})",
                    unit="jobs/s")  # fmt: skip


def claim_cost(ctx: Context, round_no: int) -> None:
    """The fair claim's and the plain claim's time with KEYS keys ready."""
    from brooq.postgres.limited import claim_fair, fair_params
    from brooq.postgres.sql import sql
    from brooq.vocabulary import Fairness

    keys = KEYS if ctx.sizes.drain_jobs >= 20_000 else 1_000
    params = {"holder": "bench:fair", "lease": timedelta(minutes=5), "topic": FAIR, "limit": 10,
              "max_running": None, "app_version": None, **fair_params(Fairness())}  # fmt: skip
    timings: dict[str, list[float]] = {"fair": [], "plain": []}
    with ctx.server.fresh("fairclaim") as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        load(conn, FAIR, keys * PER_KEY, keys, "x")
        conn.execute("ANALYZE job")
        for i in range(CLAIMS * 2):
            which = "fair" if i % 2 == 0 else "plain"
            t0 = time.perf_counter()
            with conn.transaction():
                if which == "fair":
                    conn.execute(sql("lock_fair_topic"), {"topic": FAIR})
                    rows = claim_fair(conn, params, Fairness())
                else:
                    rows = conn.execute(sql("claim_topic"), params).fetchall()
            timings[which].append((time.perf_counter() - t0) * 1000)
            if len(rows) != 10:
                raise RuntimeError(f"a {which} claim took {len(rows)} jobs, not 10")
    for which, ms in timings.items():
        for name, pct in (("p50", 50), ("p99", 99)):
            ctx.results.add(f"fair.claim.{which}.{name}", percentile(ms, pct),
                            round_no=round_no, group=GROUP,
                            label=f"claim of 10 with {keys:,} keys × {PER_KEY} ready: "
                                  f"{'the fair claim' if which == 'fair' else 'claim_topic'} "
                                  f"{name}",
                            unit="ms", higher_is_better=False)  # fmt: skip


def run_round(ctx: Context, round_no: int) -> None:
    """Pickup (fair, FIFO), drain (fair, plain), claim cost; pairs in rotating order."""
    pairs = [
        [(f"pickup {t}", partial(pickup, ctx, round_no, t)) for t in (FAIR, PLAIN)],
        [(f"drain {t}", partial(drain, ctx, round_no, t)) for t in (FAIR, PLAIN)],
    ]
    for steps in pairs:
        if round_no % 2:
            steps.reverse()
        for where, step in steps:
            ctx.guarded(f"round {round_no + 1} fairness {where}", step)
    ctx.guarded(f"round {round_no + 1} fairness claim", partial(claim_cost, ctx, round_no))
