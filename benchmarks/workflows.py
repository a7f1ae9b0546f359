"""Workflows at scale (issue 26): one child after 10,000 parents (fan-in), and 10,000
independent two-job chains, against as many plain jobs, drained by one supervisor at the
largest worker count in the same round.

Figures: jobs/s of each drain (the chains against plain jobs: what the edges cost), the
time from a parent's ``done`` (its row's updated_at: the settle statement that resolved
the edge) to its child's start (the child's handler returns ``time.time()`` as its
result), and how long the enqueue of the child after 10,000 parents took. The jobs are
loaded in one transaction after the supervisor is ready, so no edge resolves before the
clock starts. ``--quick`` (only when named: ``--only workflows``) runs 200 of each.

The supervised app is this module's ``queue`` (``--app benchmarks.workflows:queue``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg

import brooq
from benchmarks.harness import QUICK, Context, SupervisorProcess, count, wait_done
from benchmarks.runs import record_drain
from brooq.postgres.enqueue import enqueue_on
from brooq.vocabulary import Job

GROUP = "Workflows: fan-in of 10,000 parents, 10,000 two-job chains, against plain jobs"
APP = "benchmarks.workflows:queue"
PARENT, CHILD, PLAIN = "bench.parent", "bench.child", "bench.plain"

queue = brooq.Queue(os.environ.get("DATABASE_URL", ""))


@queue.kind(PARENT)
def parent(claim: brooq.Claim) -> None:
    """Nothing: a parent whose end resolves its child's edge."""


@queue.kind(CHILD)
def child(claim: brooq.Claim) -> float:
    """When it started (wall clock), stored as its result."""
    return time.time()


@queue.kind(PLAIN)
def plain(claim: brooq.Claim) -> None:
    """Nothing: the jobs without edges the chains are compared with."""


@dataclass(frozen=True)
class Sizes:
    """How many jobs: ``parents`` for the fan-in, ``chains`` two-job chains, and twice as
    many plain jobs."""

    parents: int = 10_000
    chains: int = 10_000


FULL = Sizes()
SMALL = Sizes(parents=200, chains=200)


def _insert(conn: psycopg.Connection[Any], topic: str, n: int) -> list[str]:
    rows = conn.execute(
        "INSERT INTO job (topic, payload) SELECT %s, jsonb_build_object('i', i) "
        "FROM generate_series(1, %s) AS i RETURNING id::text",
        (topic, n),
    ).fetchall()
    return [r[0] for r in rows]


def _load_fan_in(conn: psycopg.Connection[Any], n: int) -> float:
    """``n`` parents and one child after all of them; seconds the child's enqueue took."""
    parents = _insert(conn, PARENT, n)
    t0 = time.perf_counter()
    enqueue_on(conn, [Job(CHILD, after=parents)])
    return time.perf_counter() - t0


def _load_chains(conn: psycopg.Connection[Any], n: int) -> float:
    """``n`` parents, each with one child; seconds the children's enqueue took."""
    parents = _insert(conn, PARENT, n)
    t0 = time.perf_counter()
    enqueue_on(conn, [Job(CHILD, after=[p]) for p in parents])
    return time.perf_counter() - t0


def _load_plain(conn: psycopg.Connection[Any], n: int) -> float:
    _insert(conn, PLAIN, n)
    return 0.0


def _drain(ctx: Context, label: str, jobs: int, load: Any) -> tuple[float, float, list[float]]:
    """A supervisor drains what ``load`` writes in one transaction (after it is ready):
    (seconds, the load's enqueue seconds, per-child ms from its parent's done to its start)."""
    with ctx.server.fresh(label) as dsn:
        workers = ctx.sizes.max_workers
        sup = SupervisorProcess(dsn, APP, workers, ctx.sizes.poll_interval, ctx.workdir).start()
        try:
            sup.wait_ready()
            with psycopg.connect(dsn, autocommit=True) as conn:
                with conn.transaction():
                    enqueued = load(conn)
                    conn.execute("SELECT pg_notify('brooq_job', %s)", (PARENT,))
                    conn.execute("SELECT pg_notify('brooq_job', %s)", (PLAIN,))
                started = time.perf_counter()
                done_at_start = count(conn, "state = 'done'")
                seconds = wait_done(conn, jobs, started, alive=sup.alive)
                gaps = _gaps(conn)
            if done_at_start:
                raise RuntimeError(f"{done_at_start} jobs done before the clock started")
            return seconds, enqueued, gaps
        finally:
            sup.stop()


def _gaps(conn: psycopg.Connection[Any]) -> list[float]:
    """Per child: ms from its last parent's done (the settle's now()) to its handler's start."""
    rows = conn.execute(
        "SELECT (c.result::text)::float8 - max(EXTRACT(EPOCH FROM p.updated_at)) "
        "FROM job AS c JOIN job_edge AS e ON e.child_id = c.id JOIN job AS p ON p.id = e.parent_id "
        "WHERE c.topic = %s AND c.state = 'done' GROUP BY c.id, c.result",
        (CHILD,),
    ).fetchall()
    return [1000 * float(r[0]) for r in rows]


def _one(ctx: Context, round_no: int, what: str) -> None:
    sizes = SMALL if ctx.sizes is QUICK else FULL
    jobs = {"fanin": sizes.parents + 1, "chains": 2 * sizes.chains, "plain": 2 * sizes.chains}
    loads = {
        "fanin": partial(_load_fan_in, n=sizes.parents),
        "chains": partial(_load_chains, n=sizes.chains),
        "plain": partial(_load_plain, n=2 * sizes.chains),
    }
    n = ctx.sizes.max_workers
    seconds, enqueued, gaps = _drain(ctx, f"wf{what}", jobs[what], loads[what])
    key = f"workflows.{what}.N{n}"
    label = {
        "fanin": f"one child after {sizes.parents:,} parents, brooq --workers {n}",
        "chains": f"{sizes.chains:,} two-job chains, brooq --workers {n}",
        "plain": f"{2 * sizes.chains:,} plain jobs, brooq --workers {n}",
    }[what]
    record_drain(
        ctx,
        round_no,
        key,
        group=GROUP,
        label=label,
        jobs=jobs[what],
        seconds=seconds,
        done_at_start=0,
    )
    add = partial(ctx.results.add, round_no=round_no, group=GROUP)
    if what == "fanin":
        add(
            "workflows.fanin.enqueue_s",
            enqueued,
            label=f"enqueue of the child after {sizes.parents:,} parents",
            unit="s",
            higher_is_better=False,
        )
    if what == "chains":
        add(
            "workflows.chains.enqueue_s",
            enqueued,
            label=f"enqueue of {sizes.chains:,} children, each after its parent (one call)",
            unit="s",
            higher_is_better=False,
        )
    if gaps:
        where = "the fan-in's child" if what == "fanin" else "a chain's child"
        add(
            f"workflows.{what}.start_ms.p50",
            statistics.median(gaps),
            label=f"last parent done → {where} started, median",
            unit="ms",
            higher_is_better=False,
        )
        if len(gaps) > 1:
            add(
                f"workflows.{what}.start_ms.p99",
                statistics.quantiles(gaps, n=100)[98],
                label=f"last parent done → {where} started, p99",
                unit="ms",
                higher_is_better=False,
            )
    print(f"    {key}: enqueue {enqueued:.2f}s, {len(gaps)} children timed", file=sys.stderr)


def run_round(ctx: Context, round_no: int) -> None:
    """The fan-in, the chains and the plain jobs, the order rotated per round."""
    order = ["fanin", "chains", "plain"]
    order = order[round_no % 3 :] + order[: round_no % 3]
    for what in order:
        ctx.guarded(f"workflows {what}", partial(_one, ctx, round_no, what))
