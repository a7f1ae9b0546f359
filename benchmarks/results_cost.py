"""What a stored result costs (issue 24): the no-op drain at the largest worker count with
handlers that return a ~100-byte dict, against the same drain returning None, adjacent in
each round; jobs/s, and WAL bytes per job for both (pg_stat_wal around the drain)."""

from __future__ import annotations

from functools import partial

from benchmarks import drain
from benchmarks.harness import Context
from benchmarks.runs import record_drain

GROUP = "Stored results: the drain returning a 100-byte dict, against returning None"
APPS = {"none": drain.NOOP_APP, "dict": "benchmarks.apps:results"}


def _one(ctx: Context, round_no: int, returns: str) -> None:
    n, jobs = ctx.sizes.max_workers, ctx.sizes.drain_jobs
    with ctx.server.fresh(f"results{returns}") as dsn:
        got = drain.brooq_drain(ctx, dsn, n, jobs, app=APPS[returns], wal=True)
    record_drain(
        ctx,
        round_no,
        f"results.{returns}.N{n}",
        group=GROUP,
        label=f"brooq --workers {n}, handlers return {returns} ({jobs:,} jobs)",
        jobs=jobs,
        seconds=got.seconds,
        done_at_start=got.done_at_start,
    )
    wal = got.cpu.wal.get("wal_bytes")
    if wal is not None:
        ctx.results.add(
            f"results.{returns}.wal_bytes_per_job",
            wal / jobs,
            round_no=round_no,
            group=GROUP,
            label=f"WAL bytes per job, handlers return {returns}",
            unit="bytes",
            higher_is_better=False,
        )


def run_round(ctx: Context, round_no: int) -> None:
    """Both drains, their order rotated per round."""
    order = ["none", "dict"] if round_no % 2 == 0 else ["dict", "none"]
    for returns in order:
        ctx.guarded(f"results {returns}", partial(_one, ctx, round_no, returns))
