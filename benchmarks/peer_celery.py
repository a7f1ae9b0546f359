"""The Celery side of the peer benchmark; runs in benchmarks/.peers/celery (its own venv).

The app (``celery -A peer_celery worker``, run from benchmarks/) and a driver:

    python peer_celery.py drain N TASK    sends N messages of TASK (bench.noop, bench.cpu)
                                          to a staging list nobody consumes, prints
                                          "loaded", waits for "go" on stdin, then in one
                                          Redis transaction renames the list to the queue
                                          the worker consumes and reads what is left
                                          (jobs done at the start, exactly); the clock
                                          starts when that transaction returns and stops
                                          at the first 50 ms poll that finds the queue and
                                          the unacked messages empty (seen twice, 20 ms
                                          apart, so a message between its BRPOP and its
                                          unacked entry is not missed); one JSON line

Configuration: Redis broker (``BENCH_REDIS_URL``), no result backend
(results ignored), ``task_acks_late=True`` (a message is acked after its
task returns), ``worker_prefetch_multiplier=64`` (Celery's "Optimizing"
guide: for many short tasks where throughput matters, a large multiplier,
"say 64, or 128"). Each task counts what it ran; a pool process writes its
count into ``BENCH_CELERY_STATE`` when it exits, and says it booted there,
as the worker does when it is ready. It imports nothing from brooq.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown, worker_ready

QUEUE = "bench"
STAGING = "bench_staging"
UNACKED = "unacked"
PREFETCH_MULTIPLIER = int(os.environ.get("BENCH_CELERY_PREFETCH", "64"))
STALL_S = 60.0
CPU_MS = float(os.environ.get("BENCH_CPU_MS", "2"))
STATE = Path(os.environ.get("BENCH_CELERY_STATE", "."))

app = Celery("brooq_bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=PREFETCH_MULTIPLIER,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
)

_ran = [0]


def spin(ms: float) -> None:
    """Spend ``ms`` milliseconds of this thread's CPU."""
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


@app.task(name="bench.noop")
def noop() -> None:
    """Nothing."""
    _ran[0] += 1


@app.task(name="bench.cpu")
def burn() -> None:
    """``BENCH_CPU_MS`` of CPU."""
    spin(CPU_MS)
    _ran[0] += 1


@worker_process_init.connect
def _booted(**_: Any) -> None:
    (STATE / f"child-{os.getpid()}").touch()


@worker_process_shutdown.connect
def _count(**_: Any) -> None:
    (STATE / f"count-{os.getpid()}").write_text(str(_ran[0]))


@worker_ready.connect
def _ready(**_: Any) -> None:
    (STATE / "ready").touch()


def load(jobs: int, task: str) -> None:
    """``jobs`` messages of ``task`` into the staging list, through Celery's own publishing."""
    from kombu import Exchange
    from kombu import Queue as KombuQueue

    staging = KombuQueue(STAGING, Exchange(STAGING, type="direct"), routing_key=STAGING)
    with app.connection_for_write() as conn:
        staging(conn.default_channel).declare()
        with app.producer_or_acquire() as producer:
            for _ in range(jobs):
                app.send_task(task, queue=staging, producer=producer)


def drain(jobs: int, task: str) -> None:
    """Load, wait for go, release the messages and time until every one is acked."""
    import redis

    client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    load(jobs, task)
    loaded = int(client.llen(STAGING))
    if loaded != jobs:
        raise SystemExit(f"{loaded} of {jobs} messages reached {STAGING}")
    print("loaded", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected go")
    pipe = client.pipeline(transaction=True)
    pipe.rename(STAGING, QUEUE).llen(QUEUE).hlen(UNACKED)
    _, queued, unacked = pipe.execute()
    started = time.perf_counter()
    done_at_start = jobs - int(queued) - int(unacked)

    def left() -> int:
        pipe = client.pipeline(transaction=True)
        queued, unacked = pipe.llen(QUEUE).hlen(UNACKED).execute()
        return int(queued) + int(unacked)

    last, last_change = -1, started
    while True:
        remaining = left()
        now = time.perf_counter()
        if remaining == 0:
            time.sleep(0.02)
            if left() == 0:
                break
            continue
        if remaining != last:
            last, last_change = remaining, now
        elif now - last_change > STALL_S:
            raise SystemExit(f"Celery stalled with {remaining} messages left")
        time.sleep(0.05)
    print(json.dumps({"seconds": now - started, "done_at_start": done_at_start}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] != ["drain"]:
        raise SystemExit("usage: peer_celery.py drain N TASK")
    drain(int(sys.argv[2]), sys.argv[3])
