"""Idle latency: how long a job enqueued into an idle supervisor waits for its handler.

A supervisor with 2 idle workers (``benchmarks.apps:latency``, the default
1 s poll interval) and a producer enqueueing 200 jobs at ~20/s, one
``Queue.enqueue`` (one commit) at a time. Latency = the handler's
``time.time()`` at its start (written by the job's ``on_succeeded`` hook) −
the producer's ``time.time()`` when ``enqueue`` returned (the commit is
acknowledged). Run with ``QUEUE_NOTIFY`` on (workers wake on the NOTIFY) and
off (workers find the job at their next poll). Both clocks are this machine's
wall clock. A job can start before the producer hears its commit
acknowledged, so a few values may be slightly negative; they are kept.
"""

from __future__ import annotations

import time

import psycopg

from benchmarks.harness import (
    LATENCY_TOPIC,
    Context,
    SupervisorProcess,
    percentile,
    warm,
)

GROUP = "idle latency (enqueue commit → handler start)"


def measure(ctx: Context, dsn: str, notify: bool) -> list[float]:
    """Latencies in ms of ``latency_jobs`` jobs enqueued at ``latency_rate`` per second."""
    import brooq
    from benchmarks.apps import LATENCY_TABLE

    sizes = ctx.sizes
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LATENCY_TABLE)
    sup = SupervisorProcess(
        dsn,
        "benchmarks.apps:latency",
        sizes.latency_workers,
        sizes.latency_poll_interval,
        ctx.workdir,
        env={"QUEUE_NOTIFY": "true" if notify else "false"},
    ).start()
    queue = brooq.Queue(dsn, notify=notify)
    try:
        sup.wait_ready()
        warm(queue)
        time.sleep(0.5)  # let both children reach their idle wait
        committed: dict[str, float] = {}
        first = time.monotonic()
        for i in range(sizes.latency_jobs):
            delay = first + i / sizes.latency_rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            result = queue.enqueue(brooq.Job(topic=LATENCY_TOPIC, payload={"i": i}))
            committed[result.id] = time.time()
        deadline = time.monotonic() + 30
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                rows = conn.execute("SELECT job_id::text, started FROM bench_latency").fetchall()
                if len(rows) >= len(committed):
                    break
                if time.monotonic() > deadline or not sup.alive():
                    raise RuntimeError(f"only {len(rows)} of {len(committed)} jobs started")
                time.sleep(0.1)
        return [(started - committed[job_id]) * 1000 for job_id, started in rows]
    finally:
        queue.close()
        sup.stop()


def run_round(ctx: Context, round_no: int) -> None:
    """NOTIFY on and off, order rotated per round."""
    order = [True, False] if round_no % 2 == 0 else [False, True]
    for notify in order:
        name = "notify_on" if notify else "notify_off"

        def one(notify: bool = notify, name: str = name) -> None:
            with ctx.server.fresh(f"lat_{name}") as dsn:
                ms = measure(ctx, dsn, notify)
            on = "on" if notify else "off"
            poll = ctx.sizes.latency_poll_interval
            for pct in (50, 99):
                ctx.results.add(
                    f"latency.{name}.p{pct}",
                    percentile(ms, pct),
                    round_no=round_no,
                    group=GROUP,
                    label=f"NOTIFY {on}, poll {poll}: p{pct}",
                    unit="ms",
                    higher_is_better=False,
                )

        ctx.guarded(f"round {round_no + 1} latency.{name}", one)
