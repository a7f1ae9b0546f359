"""The pgqueuer side of the peer benchmark; runs in benchmarks/.peers/pgqueuer (its own venv).

    python peer_pgqueuer.py install DSN              create pgqueuer's schema (durable tables)
    python peer_pgqueuer.py work DSN BATCH CPU_MS    one QueueManager (asyncpg), prints "ready",
                                                     runs until SIGTERM; each job spins CPU_MS
                                                     of its thread's CPU (0: a no-op)
    python peer_pgqueuer.py drain DSN N              connects, prints "loaded <backend pid>",
                                                     waits for "go" on stdin, enqueues N jobs in
                                                     one call (one statement), starts the clock
                                                     when it returns, counts at once the jobs
                                                     already done, polls every 50 ms until the
                                                     queue table is empty; prints one JSON line

It imports nothing from brooq: the peer venv has only pgqueuer and asyncpg.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Job, QueueManager
from pgqueuer.queries import Queries

ENTRYPOINT = "bench_noop"
STALL_S = 60.0


def spin(ms: float) -> None:
    """Spend ``ms`` milliseconds of this thread's CPU."""
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


async def install(dsn: str) -> None:
    """Create pgqueuer's tables, types, trigger and functions."""
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def work(dsn: str, batch: int, cpu_ms: float) -> None:
    """One worker process: the documented setup, an async entrypoint."""
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def handler(job: Job) -> None:
        """Nothing, or ``cpu_ms`` of CPU (it holds the event loop, as CPU-bound work does)."""
        if cpu_ms:
            spin(cpu_ms)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    print("ready", flush=True)
    try:
        await qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=1))
    finally:
        await conn.close()


async def left(conn: asyncpg.Connection) -> int:
    """Jobs still in the queue table (a completed job is deleted from it)."""
    return int(await conn.fetchval("SELECT count(*) FROM pgqueuer"))


async def drain(dsn: str, jobs: int) -> None:
    """Enqueue on "go", time until the queue is empty; print the result as JSON."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        print(f"loaded {backend}", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("expected go")
        # In a transaction of our own, so the clock starts at the commit (the jobs become
        # visible then), not after pgqueuer has turned 20,000 returned ids into Python
        # objects: its workers would have been running them meanwhile.
        transaction = conn.transaction()
        await transaction.start()
        await queries.enqueue([ENTRYPOINT] * jobs, [b"{}"] * jobs, [0] * jobs)
        await transaction.commit()
        started = time.perf_counter()
        done_at_start = jobs - await left(conn)
        last, last_change = -1, started
        while True:
            remaining = await left(conn)
            now = time.perf_counter()
            if remaining == 0:
                break
            if remaining != last:
                last, last_change = remaining, now
            elif now - last_change > STALL_S:
                raise SystemExit(f"pgqueuer stalled with {remaining} jobs left")
            await asyncio.sleep(0.05)
        print(json.dumps({"seconds": now - started, "done_at_start": done_at_start}), flush=True)
    finally:
        await conn.close()


def main(argv: list[str]) -> None:
    """Dispatch the subcommand."""
    command, dsn = argv[0], argv[1]
    if command == "install":
        asyncio.run(install(dsn))
    elif command == "work":
        asyncio.run(work(dsn, int(argv[2]), float(argv[3])))
    elif command == "drain":
        asyncio.run(drain(dsn, int(argv[2])))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
