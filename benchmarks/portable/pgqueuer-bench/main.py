"""pgqueuer's adapter for the harness's long-horizon contract (../contract.py says what it is).

The harness has no pgqueuer adapter; this one drives pgqueuer (PyPI, its own
venv, the asyncpg driver) the way its documentation runs a worker, in one
asyncio process as the harness's procrastinate adapter does:

- at start, ``Queries.install()`` unless the schema is there (pgqueuer's own
  install path; replicas racing to it are fine), then the descriptor;
- the worker: ``pgqueuer.run`` (what ``pgq run`` calls) on a factory that opens
  an asyncpg connection and yields a ``QueueManager`` with one entrypoint, with
  ``pgq run``'s defaults but ``restart_on_failure`` (a worker that loses its
  database comes back, as brooq's supervisor does by itself) and
  ``max_concurrent_tasks = WORKER_COUNT`` (its batch size lowered to fit, as
  pgqueuer requires twice the batch);
- the handler: the pickup latency (insert → handler start, the insert time rides
  in the payload), ``JOB_WORK_MS`` of ``asyncio.sleep``, one completion;
- a producer: ``Queries.enqueue`` with lists (one multi-row insert per batch),
  paced by the harness's ``ENQUEUE <n>`` tokens, by its own clock
  (PRODUCER_PACING=adapter) or to a target depth;
- on replica 0, the depth from ``Queries.queue_size()`` (queued and picked);
- one sample of every metric on each clock-aligned tick.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
import pgqueuer
from contract import (
    OBSERVER_METRICS,
    PICKUP_WINDOW_S,
    Credit,
    Emitter,
    LatencyWindow,
    Settings,
    next_tick,
    parse_token,
    payload,
)
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

SYSTEM = "pgqueuer"
ENTRYPOINT = "bench_job"
TABLES = [
    "public.pgqueuer",
    "public.pgqueuer_log",
    "public.pgqueuer_statistics",
    "public.pgqueuer_schedules",
]
INDEXES = [
    "public.pgqueuer_pkey",
    "public.pgqueuer_ep_prio_id_idx",
    "public.pgqueuer_picked_heartbeat_idx",
    "public.pgqueuer_log_pkey",
    "public.pgqueuer_log_not_aggregated",
]
log = logging.getLogger("pgqueuer-bench")


@dataclass
class Stats:
    """Counters shared by the tasks (one event loop: no lock needed)."""

    enqueued: int = 0
    completed: int = 0
    enqueue_failures: int = 0
    ready: int = 0
    running: int = 0
    target_rate: float = 0.0
    pickup: LatencyWindow = field(default_factory=LatencyWindow)


class Adapter:
    """One replica: worker, producer, depth poller and sampler in one event loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.emitter = Emitter(SYSTEM, settings.instance_id)
        self.stats = Stats()
        self.shutdown = asyncio.Event()
        self.tokens: asyncio.Queue[int] = asyncio.Queue()
        work = settings.worker_count
        self.batch_size = max(1, min(10, work // 2))
        self.max_tasks = work if work >= 2 * self.batch_size else None

    async def install(self) -> None:
        """pgqueuer's schema, unless it is there already (another replica may race us)."""
        conn = await asyncpg.connect(self.settings.database_url)
        try:
            queries = Queries(AsyncpgDriver(conn))
            if not await queries.schema_is_installed():
                try:
                    await queries.install()
                except asyncpg.PostgresError:
                    if not await queries.schema_is_installed():
                        raise
        finally:
            await conn.close()

    @asynccontextmanager
    async def worker(self) -> AsyncIterator[QueueManager]:
        """The factory ``pgqueuer.run`` calls (again after a failure): one QueueManager."""
        conn = await asyncpg.connect(self.settings.database_url)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))
        work_s = self.settings.work_ms / 1000.0

        @qm.entrypoint(ENTRYPOINT)
        async def bench_job(job: Job) -> None:
            started = time.time()
            inserted = float(json.loads(job.payload or b"{}").get("t", started))
            self.stats.pickup.add((started - inserted) * 1000.0, time.monotonic())
            if work_s > 0:
                await asyncio.sleep(work_s)
            self.stats.completed += 1

        try:
            yield qm
        finally:
            with suppress(Exception):
                await conn.close()

    async def run_worker(self) -> None:
        """``pgqueuer.run`` with ``pgq run``'s defaults, restarting after a failure."""
        await pgqueuer.run(
            self.worker,
            batch_size=self.batch_size,
            max_concurrent_tasks=self.max_tasks,
            restart_on_failure=True,
            shutdown=self.shutdown,
        )

    def read_tokens(self, loop: asyncio.AbstractEventLoop) -> None:
        """The harness's ENQUEUE tokens (a thread); its closing stdin ends the run."""
        for line in sys.stdin:
            n = parse_token(line)
            if n:
                loop.call_soon_threadsafe(self.tokens.put_nowait, n)
        loop.call_soon_threadsafe(self.shutdown.set)

    async def next_batch(self, credit: Credit) -> int:
        """How many jobs to insert now (0: nothing yet), by the pacing the harness chose."""
        s = self.settings
        if s.producer_mode == "depth-target":
            self.stats.target_rate = 0.0
            owed = s.target_depth - self.stats.ready
            if owed <= 0:
                await asyncio.sleep(0.05)
            return max(0, owed)
        rate = s.current_rate()
        self.stats.target_rate = float(rate)
        if s.harness_paced:
            try:
                return await asyncio.wait_for(self.tokens.get(), timeout=0.5)
            except TimeoutError:
                return 0
        await asyncio.sleep(max(0.0, s.batch_ms / 1000.0 - (time.monotonic() - credit.last)))
        return credit.take(time.monotonic(), rate, s.batch_max)

    async def produce(self) -> None:
        """Insert what the pacing asks for, ``PRODUCER_BATCH_MAX`` jobs per enqueue."""
        s = self.settings
        conn: asyncpg.Connection | None = None
        credit = Credit(time.monotonic())
        seq = 0
        last_error = 0.0
        while not self.shutdown.is_set():
            owed = await self.next_batch(credit)
            while owed > 0 and not self.shutdown.is_set():
                n = min(owed, s.batch_max)
                owed -= n
                payloads: list[bytes | None] = [
                    json.dumps(payload(seq + i, time.time(), s.payload_bytes)).encode()
                    for i in range(n)
                ]
                seq += n
                try:
                    if conn is None or conn.is_closed():
                        conn = await asyncpg.connect(s.database_url)
                    await Queries(AsyncpgDriver(conn)).enqueue([ENTRYPOINT] * n, payloads, [0] * n)
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    self.stats.enqueue_failures += n
                    if time.monotonic() - last_error > 5:
                        log.warning("enqueue of %d jobs failed: %s", n, exc)
                        last_error = time.monotonic()
                    if conn is not None:
                        with suppress(Exception):
                            await conn.close()
                    conn = None
                    await asyncio.sleep(0.2)
                    continue
                self.stats.enqueued += n
        if conn is not None:
            await conn.close()

    async def poll_depth(self) -> None:
        """Queued and picked jobs of the entrypoint (replica 0 only), every second."""
        period = 0.2 if self.settings.producer_mode == "depth-target" else 1.0
        conn: asyncpg.Connection | None = None
        while not self.shutdown.is_set():
            await asyncio.sleep(period)
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(self.settings.database_url)
                rows = await Queries(AsyncpgDriver(conn)).queue_size()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                conn = None
                continue
            mine = [r for r in rows if r.entrypoint == ENTRYPOINT]
            self.stats.ready = sum(r.count for r in mine if r.status == "queued")
            self.stats.running = sum(r.count for r in mine if r.status == "picked")
        if conn is not None:
            await conn.close()

    def emit(self, since: float, last_enqueued: int, last_completed: int) -> None:
        """One tick's samples."""
        every = float(self.settings.sample_every_s)
        dt = max(0.001, time.monotonic() - since)
        p50, p95, p99 = self.stats.pickup.percentiles((0.50, 0.95, 0.99), time.monotonic())
        metrics = [
            ("claim_p50_ms", p50, PICKUP_WINDOW_S),
            ("claim_p95_ms", p95, PICKUP_WINDOW_S),
            ("claim_p99_ms", p99, PICKUP_WINDOW_S),
            ("enqueue_rate", (self.stats.enqueued - last_enqueued) / dt, every),
            ("completion_rate", (self.stats.completed - last_completed) / dt, every),
            ("queue_depth", float(self.stats.ready), 0.0),
            ("running_depth", float(self.stats.running), 0.0),
            ("producer_target_rate", self.stats.target_rate, 0.0),
        ]
        for metric, value, window_s in metrics:
            if metric in OBSERVER_METRICS and not self.settings.observer:
                continue
            self.emitter.sample(metric, value, window_s)

    async def sample(self) -> None:
        """Emit on every clock-aligned tick until the shutdown."""
        every = self.settings.sample_every_s
        tick = next_tick(time.time(), every)
        since, enqueued, completed = time.monotonic(), 0, 0
        while not self.shutdown.is_set():
            with suppress(TimeoutError):
                await asyncio.wait_for(self.shutdown.wait(), max(0.0, tick - time.time()))
            if self.shutdown.is_set():
                return
            self.emit(since, enqueued, completed)
            since, enqueued, completed = (
                time.monotonic(),
                self.stats.enqueued,
                self.stats.completed,
            )
            tick = max(tick + every, next_tick(time.time(), every))

    async def run(self) -> int:
        """The whole life of the replica; its exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.shutdown.set)
        await self.install()
        self.emitter.descriptor(
            event_tables=TABLES,
            event_indexes=INDEXES,
            extensions=[],
            version=f"pgqueuer {pgqueuer.__version__}",
            schema_version=f"pgqueuer {pgqueuer.__version__}",
            db_name=self.settings.db_name,
        )
        if self.settings.harness_paced:
            threading.Thread(target=self.read_tokens, args=(loop,), daemon=True).start()
        tasks = [
            asyncio.create_task(self.run_worker(), name="worker"),
            asyncio.create_task(self.produce(), name="producer"),
            asyncio.create_task(self.sample(), name="sampler"),
        ]
        if self.settings.observer:
            tasks.append(asyncio.create_task(self.poll_depth(), name="depth"))
        stopped = asyncio.create_task(self.shutdown.wait())
        await asyncio.wait([stopped, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if not self.shutdown.is_set():
            log.error("the pgqueuer worker ended by itself: %r", tasks[0].exception())
            self.shutdown.set()
            code = 1
        done, pending = await asyncio.wait(tasks, timeout=4.0)
        for task in pending:
            task.cancel()
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("%s failed: %r", task.get_name(), task.exception())
        log.info(
            "replica %d: enqueued %d, completed %d, enqueue failures %d",
            self.settings.instance_id,
            self.stats.enqueued,
            self.stats.completed,
            self.stats.enqueue_failures,
        )
        return code


def main() -> int:
    """Read the contract's settings, run the replica until SIGTERM."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="[pgqueuer-bench] %(message)s"
    )
    settings = Settings.from_env(os.environ)
    return asyncio.run(Adapter(settings).run())


if __name__ == "__main__":
    raise SystemExit(main())
