"""The pgqueuer side of the peer benchmark; runs in benchmarks/.peers/pgqueuer (its own venv).

    python peer_pgqueuer.py install DSN        create pgqueuer's schema (durable tables)
    python peer_pgqueuer.py work DSN BATCH     one QueueManager (asyncpg), prints "ready",
                                               runs until SIGTERM
    python peer_pgqueuer.py enqueue DSN N      N no-op jobs in one enqueue call (one
                                               statement); prints time.time() after it

It imports nothing from brooq: the peer venv has only pgqueuer and asyncpg.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Job, QueueManager
from pgqueuer.queries import Queries

ENTRYPOINT = "bench_noop"


async def install(dsn: str) -> None:
    """Create pgqueuer's tables, types, trigger and functions."""
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def work(dsn: str, batch: int) -> None:
    """One worker process: the documented setup, a no-op async entrypoint."""
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        """Nothing."""

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    print("ready", flush=True)
    try:
        await qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=1))
    finally:
        await conn.close()


async def enqueue(dsn: str, jobs: int) -> None:
    """Enqueue ``jobs`` in one call (lists: one INSERT statement)."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.enqueue([ENTRYPOINT] * jobs, [b"{}"] * jobs, [0] * jobs)
        print(time.time(), flush=True)
    finally:
        await conn.close()


def main(argv: list[str]) -> None:
    """Dispatch the subcommand."""
    command, dsn = argv[0], argv[1]
    if command == "install":
        asyncio.run(install(dsn))
    elif command == "work":
        asyncio.run(work(dsn, int(argv[2])))
    elif command == "enqueue":
        asyncio.run(enqueue(dsn, int(argv[2])))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
