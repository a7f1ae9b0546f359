"""One timed drain's record: its throughput, and how many jobs were done when its clock started.

Every system's clock starts when its first job can be taken (brooq and the
raw loops: the commit of the jobs, or the signal that releases the raw
workers; pgqueuer: the commit of its enqueue, run in a transaction of the
harness; Celery: the Redis transaction that puts the loaded messages under
the queue's name). The jobs already done
at that moment are counted at once: by the first poll, on a connection
opened before (an upper bound), or for Celery inside that same Redis
transaction (exact). Any count but 0 voids the drain's figure: the run
records the count, reports an error and goes on.
"""

from __future__ import annotations

import sys

from benchmarks.harness import Context

START_GROUP = "jobs already done when the clock started (must be 0, else the figure is void)"


class EarlyStart(RuntimeError):
    """Jobs were done before the clock started: the throughput would be flattered."""


def record_drain(
    ctx: Context,
    round_no: int,
    key: str,
    *,
    group: str,
    label: str,
    jobs: int,
    seconds: float,
    done_at_start: int,
) -> None:
    """Record ``start.<key>`` (jobs done at the start) and, when it is 0, ``key`` in jobs/s."""
    ctx.results.add(
        f"start.{key}",
        done_at_start,
        round_no=round_no,
        group=START_GROUP,
        label=key,
        unit="jobs",
        higher_is_better=False,
    )
    print(
        f"    {key}: {jobs:,} jobs in {seconds:.2f}s ({jobs / seconds:,.0f}/s); "
        f"{done_at_start} done when the clock started",
        file=sys.stderr,
        flush=True,
    )
    if done_at_start:
        raise EarlyStart(
            f"{done_at_start} of {jobs:,} jobs were done before the clock started; "
            "the figure is void"
        )
    ctx.results.add(key, jobs / seconds, round_no=round_no, group=group, label=label, unit="jobs/s")
