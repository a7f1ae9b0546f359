"""The CPU-bound drain: every handler spins ``--cpu-ms`` of its own thread's CPU (default 2 ms).

The same drain as the no-op one (benchmarks/drain.py: workers ready, jobs
made takeable at once, clock from then until all are done), with
``cpu_jobs`` jobs (10,000) whose handler spends ``cpu_ms`` of CPU in a
``time.thread_time()`` loop (benchmarks/apps.py's ``spin``; each peer has
the same loop), for every system:

- brooq supervise at N = 2 and 8 (``benchmarks.apps:cpu``);
- the raw loops at P = 2 and 8: the two-commit floor and the batched one
  (10 rows per claim and per settle), spinning between claim and settle;
- the peers (``--peers``) at the largest N: pgqueuer's best configuration,
  Celery prefork.

The ideal on this machine is cores × 1000 / cpu_ms jobs/s (every core
spinning handlers and nothing else); ``cpubound.ideal`` carries it per round
so that every system's ratio to it is a ratio like any other. At each N, the
systems run adjacent and their order rotates from round to round.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

from benchmarks import cpu, peers, raw
from benchmarks.apps import CPU_TOPIC
from benchmarks.drain import brooq_drain
from benchmarks.harness import Context
from benchmarks.runs import record_drain

CPU_APP = "benchmarks.apps:cpu"
RAW_MODES = ("two", "batch")


def group(ctx: Context) -> str:
    """The report group of this workload."""
    return (
        f"CPU-bound drain ({ctx.cpu_ms:g} ms of CPU per job, "
        f"{ctx.sizes.cpu_jobs:,} jobs, timed until all done)"
    )


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def ideal(cpu_ms: float) -> float:
    """jobs/s with every core spinning handlers and nothing else."""
    return cores() * 1000 / cpu_ms


def _brooq(ctx: Context, round_no: int, n: int) -> None:
    jobs = ctx.sizes.cpu_jobs
    with ctx.server.fresh(f"cpub{n}") as dsn:
        result = brooq_drain(
            ctx,
            dsn,
            n,
            jobs,
            app=CPU_APP,
            topic=CPU_TOPIC,
            env={"BENCH_CPU_MS": f"{ctx.cpu_ms:g}"},
        )
    ctx.results.count_deadlocks(f"round {round_no + 1} brooq N={n} cpu-bound", result.deadlocks)
    label = f"brooq supervise --workers {n}"
    record_drain(
        ctx,
        round_no,
        f"cpubound.brooq.N{n}",
        group=group(ctx),
        label=label,
        jobs=jobs,
        seconds=result.seconds,
        done_at_start=result.done_at_start,
    )
    cpu.record_per_job(
        ctx,
        round_no,
        f"cpu.brooq.N{n}",
        f"cpu {ctx.cpu_ms:g} ms, {label}",
        result.cpu,
        jobs,
        handler_ms=ctx.cpu_ms,
        parts=True,
    )


def _raw(ctx: Context, round_no: int, p: int, mode: str) -> None:
    jobs = ctx.sizes.cpu_jobs
    with ctx.server.fresh(f"cpuraw{mode}{p}") as dsn:
        result = raw.drain(dsn, mode, p, jobs, ctx.sizes.batch_claim, cpu_ms=ctx.cpu_ms)
    ctx.results.count_deadlocks(f"round {round_no + 1} raw {mode} P={p} cpu", result.deadlocks)
    label = f"raw P={p}: {raw.MODES[mode]}"
    record_drain(
        ctx,
        round_no,
        f"cpubound.raw_{mode}.P{p}",
        group=group(ctx),
        label=label,
        jobs=jobs,
        seconds=result.seconds,
        done_at_start=result.done_at_start,
    )
    cpu.record_per_job(
        ctx, round_no, f"cpu.raw_{mode}.P{p}", f"cpu {ctx.cpu_ms:g} ms, {label}", result.cpu, jobs
    )


def _peer(ctx: Context, round_no: int, name: str, n: int) -> None:
    peers.run_peer(ctx, round_no, name, n, cpu_ms=ctx.cpu_ms, group=group(ctx), prefix="cpubound")


def run_round(ctx: Context, round_no: int) -> None:
    """One round: at each N, brooq, the raw loops (and the peers at the largest N) adjacent."""
    ctx.results.add(
        "cpubound.ideal",
        ideal(ctx.cpu_ms),
        round_no=round_no,
        group=group(ctx),
        label=f"ideal: {cores()} cores × 1000 / {ctx.cpu_ms:g} ms",
        unit="jobs/s",
    )
    top = max(ctx.sizes.cpu_workers)
    for n in ctx.sizes.cpu_workers:
        steps: list[tuple[str, Callable[[], None]]] = [
            (f"cpubound.brooq.N{n}", partial(_brooq, ctx, round_no, n))
        ]
        steps += [(f"cpubound.raw_{m}.P{n}", partial(_raw, ctx, round_no, n, m)) for m in RAW_MODES]
        if n == top:
            steps += [
                (f"cpubound.{name}.N{n}", partial(_peer, ctx, round_no, name, n))
                for name in ctx.peers
            ]
        shift = round_no % len(steps)
        for where, step in steps[shift:] + steps[:shift]:
            ctx.guarded(f"round {round_no + 1} {where}", step)
