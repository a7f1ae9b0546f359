"""The CPU of an idle supervisor: N workers (8), nothing to do, over 10 s.

A real ``brooq supervise --workers 8`` on a fresh database, at brooq's
default poll interval (1 s) with NOTIFY on, as deployed. After its
``SupervisorReady`` event and one more second (boot is not idling), the
schedstat of every thread of the parent, of every worker, and of the
PostgreSQL backends of its database is read, again 10 s later; CPU time /
10 s is the share of one core each used (100% = one core busy).
"""

from __future__ import annotations

import time

import psycopg

from benchmarks.cpu import CpuProbe
from benchmarks.drain import NOOP_APP
from benchmarks.harness import Context, SupervisorProcess

SETTLE_S = 1.0
PARTS = {
    "parent": "supervisor (parent, all its threads)",
    "workers": "workers, summed",
    "postgres": "PostgreSQL backends of its database",
}


def group(ctx: Context) -> str:
    """The report group."""
    s = ctx.sizes
    return (
        f"idle supervisor ({s.idle_workers} workers, nothing to do, {s.idle_seconds:g} s, "
        f"poll {s.idle_poll_interval}; % of one core)"
    )


def measure(ctx: Context, dsn: str) -> dict[str, float]:
    """% of one core per part over ``idle_seconds`` of a ready, idle supervisor."""
    s = ctx.sizes
    sup = SupervisorProcess(dsn, NOOP_APP, s.idle_workers, s.idle_poll_interval, ctx.workdir)
    sup.start()
    try:
        sup.wait_ready()
        time.sleep(SETTLE_S)
        with psycopg.connect(dsn, autocommit=True) as conn:
            probe = CpuProbe(conn, {"parent": [sup.pid], "workers": sup.children()})
            time.sleep(s.idle_seconds)
            usage = probe.finish()
            if not sup.alive():
                raise RuntimeError(f"brooq supervise exited while idle:\n{sup.log_tail()}")
        return {g: 100 * seconds / usage.wall for g, seconds in usage.cpu.items()}
    finally:
        sup.stop()


def run_round(ctx: Context, round_no: int) -> None:
    """One idle measurement."""

    def one() -> None:
        with ctx.server.fresh("idle") as dsn:
            pct = measure(ctx, dsn)
        for part, value in pct.items():
            ctx.results.add(
                f"idle.{part}_pct",
                value,
                round_no=round_no,
                group=group(ctx),
                label=PARTS[part],
                unit="% of a core",
                higher_is_better=False,
            )
        ctx.results.add(
            "idle.supervisor_pct",
            pct.get("parent", 0.0) + pct.get("workers", 0.0),
            round_no=round_no,
            group=group(ctx),
            label="supervisor and workers together",
            unit="% of a core",
            higher_is_better=False,
        )

    ctx.guarded(f"round {round_no + 1} idle", one)
