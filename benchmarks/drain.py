"""Drain throughput: a real ``brooq supervise`` at N workers against the raw floor at P = N.

Method (steady state): start ``brooq supervise --app benchmarks.apps:queue
--workers N --http-addr 127.0.0.1:0 --poll-interval 100ms`` on a fresh
database, wait for its ``SupervisorReady`` log event (every child booted and
idle on LISTEN), then insert 20,000 ready no-op jobs in one statement and
NOTIFY in the same transaction. The clock starts when that transaction has
committed and stops at the first 50 ms poll of ``SELECT count(*) FROM job
WHERE state = 'done'`` that sees all 20,000. Nothing is subtracted. The raw
workers (benchmarks/raw.py) are timed the same way from the moment they are
released. The first poll, at once, counts the jobs already done when the
clock started (benchmarks/runs.py: it must be 0).

At each N, the brooq run and the raw runs are adjacent and their order
rotates from round to round, so a noisy minute hits both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import psycopg

from benchmarks import cpu, peers, profile, raw
from benchmarks.cpu import CpuProbe, CpuUsage
from benchmarks.harness import (
    TOPIC,
    Context,
    SupervisorProcess,
    count,
    load_ready_jobs,
    wait_done,
)
from benchmarks.runs import record_drain

GROUP = "drain (no-op jobs loaded into idle workers, timed until all done)"
PRIORITY_GROUP = "claim with priorities (issue 8)"
CONNECTIONS_GROUP = "connections (most held at once during the drain; no-effect jobs)"
CPU_MODES = {"two": "raw floor P={p}", "fused": "raw fused P={p}"}
NOOP_APP = "benchmarks.apps:queue"


@dataclass
class Drained:
    """What one brooq drain measured."""

    seconds: float
    done_at_start: int
    """Jobs already done when the clock started (the first poll, at once)."""
    cpu: CpuUsage
    deadlocks: int
    connections: int
    """The most PostgreSQL connections the supervisor and its workers held at once."""


class ConnectionSampler:
    """Counts, every 20 ms on its own connection, the client backends of the database
    other than the benchmark's own (``exclude``); keeps the highest count."""

    def __init__(self, dsn: str, exclude: set[int]) -> None:
        self.dsn, self.exclude, self.most = dsn, exclude, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            mine = {conn.info.backend_pid, *self.exclude}
            while not self._stop.wait(0.02):
                pids = {
                    pid
                    for (pid,) in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND backend_type = 'client backend'"
                    )
                }
                self.most = max(self.most, len(pids - mine))


def brooq_drain(
    ctx: Context,
    dsn: str,
    workers: int,
    jobs: int,
    *,
    app: str = NOOP_APP,
    topic: str = TOPIC,
    env: dict[str, str] | None = None,
    mixed: bool = False,
    profile_to: str | None = None,
    wal: bool = False,
) -> Drained:
    """Time a real supervisor draining ``jobs`` loaded after it is ready."""
    if wal:
        cpu.enable_wal_timing(dsn)
    sup = SupervisorProcess(dsn, app, workers, ctx.sizes.poll_interval, ctx.workdir, env).start()
    try:
        sup.wait_ready()
        with psycopg.connect(dsn, autocommit=True) as conn:
            children = sup.children()
            probe = CpuProbe(conn, {"parent": [sup.pid], "workers": children}, wal=wal)
            with ConnectionSampler(dsn, {conn.info.backend_pid}) as sampler:
                load_ready_jobs(conn, jobs, topic=topic, mixed_priorities=mixed)
                started = probe.started = time.perf_counter()
                done_at_start = count(conn, "state = 'done'")
                spy = profile.start(ctx, profile_to, sup.pid, children) if profile_to else None
                try:
                    seconds = wait_done(conn, jobs, started, alive=sup.alive)
                finally:
                    if spy is not None:
                        spy.stop(ctx, jobs)
            usage = probe.finish()
            sup.stop()
            probe.read_wal(usage)
        return Drained(
            seconds, done_at_start, usage, sup.log_count(b"deadlock detected"), sampler.most
        )
    finally:
        sup.stop()


def _brooq(ctx: Context, round_no: int, n: int) -> None:
    jobs = ctx.sizes.drain_jobs
    biggest = n == ctx.sizes.max_workers
    with ctx.server.fresh(f"drain{n}") as dsn:
        result = brooq_drain(ctx, dsn, n, jobs, wal=biggest)
    ctx.results.count_deadlocks(f"round {round_no + 1} brooq N={n}", result.deadlocks)
    label = f"brooq supervise --workers {n} ({jobs:,} jobs)"
    record_drain(
        ctx,
        round_no,
        f"drain.brooq.N{n}",
        group=GROUP,
        label=label,
        jobs=jobs,
        seconds=result.seconds,
        done_at_start=result.done_at_start,
    )
    ctx.results.add(
        f"connections.brooq.N{n}",
        result.connections,
        round_no=round_no,
        group=CONNECTIONS_GROUP,
        label=f"brooq --workers {n}: PostgreSQL connections held while draining",
        unit="connections",
    )
    cpu.record_per_job(
        ctx, round_no, f"noop.brooq.N{n}", f"no-op, {label}", result.cpu, jobs, parts=True
    )
    if biggest:
        cpu.record(ctx, round_no, "brooq", f"brooq N={n}", result.cpu, jobs)


def _raw(ctx: Context, round_no: int, p: int, mode: str) -> None:
    jobs = ctx.sizes.drain_jobs
    biggest = p == ctx.sizes.max_workers
    with ctx.server.fresh(f"raw{mode}{p}") as dsn:
        result = raw.drain(
            dsn, mode, p, jobs, ctx.sizes.batch_claim, wal=mode in CPU_MODES and biggest
        )
    ctx.results.count_deadlocks(f"round {round_no + 1} raw {mode} P={p}", result.deadlocks)
    label = f"raw P={p}: {raw.MODES[mode]}"
    record_drain(
        ctx,
        round_no,
        f"drain.raw_{mode}.P{p}",
        group=GROUP,
        label=label,
        jobs=jobs,
        seconds=result.seconds,
        done_at_start=result.done_at_start,
    )
    if biggest:
        cpu.record_per_job(
            ctx, round_no, f"noop.raw_{mode}.P{p}", f"no-op, {label}", result.cpu, jobs
        )
    if mode in CPU_MODES and biggest:
        cpu.record(ctx, round_no, f"raw_{mode}", CPU_MODES[mode].format(p=p), result.cpu, jobs)


def _priorities(ctx: Context, round_no: int, n: int) -> None:
    jobs = ctx.sizes.drain_jobs
    with ctx.server.fresh(f"prio{n}") as dsn:
        result = brooq_drain(ctx, dsn, n, jobs, mixed=True)
    ctx.results.count_deadlocks(f"round {round_no + 1} brooq N={n} mixed", result.deadlocks)
    record_drain(
        ctx,
        round_no,
        f"priority.mixed.N{n}",
        group=PRIORITY_GROUP,
        label=f"brooq --workers {n}, priorities 0..9 mixed",
        jobs=jobs,
        seconds=result.seconds,
        done_at_start=result.done_at_start,
    )


def run_round(ctx: Context, round_no: int) -> None:
    """One round: for each N, brooq and the raw variants adjacent, order rotated per round."""
    want_brooq = (
        ctx.wants("drain") or ctx.wants("cpu") or ctx.wants("priorities") or bool(ctx.peers)
    )
    want_raw = ctx.wants("raw") or ctx.wants("cpu")
    full = ctx.wants("drain") or ctx.wants("raw")
    counts = ctx.sizes.drain_workers if full else (ctx.sizes.max_workers,)
    for n in counts:
        steps: list[tuple[str, Callable[[], None]]] = []
        if want_brooq and (ctx.wants("drain") or n == ctx.sizes.max_workers):
            steps.append((f"drain.brooq.N{n}", partial(_brooq, ctx, round_no, n)))
        modes = ["two", "fused", "batch"] if ctx.wants("raw") else list(CPU_MODES)
        if want_raw:
            steps += [(f"drain.raw_{m}.P{n}", partial(_raw, ctx, round_no, n, m)) for m in modes]
        if n == ctx.sizes.max_workers:
            steps += [
                (f"peer.{name}.N{n}", partial(peers.run_peer, ctx, round_no, name, n))
                for name in ctx.peers
            ]
        if ctx.wants("priorities") and n == ctx.sizes.max_workers:
            steps.append((f"priority.mixed.N{n}", partial(_priorities, ctx, round_no, n)))
        shift = round_no % len(steps) if steps else 0
        for where, step in steps[shift:] + steps[:shift]:
            ctx.guarded(f"round {round_no + 1} {where}", step)


def profile_run(ctx: Context) -> None:
    """One more drain at the largest N under py-spy, after the rounds; not in the figures."""
    n, jobs = ctx.sizes.max_workers, ctx.sizes.drain_jobs

    def one() -> None:
        with ctx.server.fresh(f"profile{n}") as dsn:
            result = brooq_drain(ctx, dsn, n, jobs, profile_to="drain")
        ctx.results.notes["profiled drain"] = (
            f"{jobs / result.seconds:,.0f} jobs/s at N={n} while profiled (py-spy running; "
            "not part of the figures)"
        )

    ctx.guarded("profile run", one)
