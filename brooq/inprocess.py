"""``brooq work``: one slot in this process, in the foreground, until SIGTERM/SIGINT.

The handler runs in the main thread (soft interrupts work). A thread with
its own connection keeps the lease; LISTEN wakes the idle slot. The slot
also runs the reaper and retention, so a lone worker needs nothing else.
For isolation per process, use ``brooq supervise``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

import psycopg

from brooq.engine.reaper import Reaper
from brooq.engine.retention import Retention
from brooq.engine.runner import Attempted, RunListener, SlotRunner
from brooq.engine.store import Claimed, Store, Ticket
from brooq.engine.timer import Every
from brooq.logs import LoggingListener
from brooq.postgres.connect import connect
from brooq.postgres.store import PostgresStore
from brooq.queue import Queue
from brooq.vocabulary import KindOptions, StoreUnavailable

log = logging.getLogger("brooq.inprocess")

MAX_RECONNECT_BACKOFF_S = 30.0


@dataclass(frozen=True)
class WorkerConfig:
    """What one in-process slot needs to run."""

    dsn: str
    lease: timedelta
    poll_interval: timedelta
    reaper_period: timedelta
    retention_ttl: timedelta
    retention_batch: int
    retention_period: timedelta
    topics: Sequence[str] | None = None
    max_jobs: int = 0
    exit_when_idle: bool = False


class LeaseKeeper(threading.Thread):
    """Extends the lease of the running job every lease/3; interrupts the handler when lost."""

    def __init__(self, store: Store, lease: timedelta) -> None:
        super().__init__(name="brooq-lease", daemon=True)
        self.store, self.lease = store, lease
        self._ticket: Ticket | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def hold(self, ticket: Ticket | None) -> None:
        """Start (or with None stop) keeping ``ticket``'s lease."""
        with self._lock:
            self._ticket = ticket

    def run(self) -> None:
        """Heartbeat until stopped."""
        while not self._stop.wait(self.lease.total_seconds() / 3):
            with self._lock:
                ticket = self._ticket
            if ticket is None:
                continue
            try:
                kept = self.store.heartbeat([ticket], self.lease)
            except StoreUnavailable as exc:
                log.warning("heartbeat failed",
                            extra={"event": "HeartbeatFailed", "error": str(exc)})
                continue
            with self._lock:
                if ticket.job_id not in kept and self._ticket == ticket:
                    self._ticket = None
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    def stop(self) -> None:
        """End the thread."""
        self._stop.set()


class _KeeperListener:
    """Ties the keeper to the slot's claims, then forwards to the log listener."""

    def __init__(self, keeper: LeaseKeeper, inner: RunListener) -> None:
        self.keeper, self.inner = keeper, inner

    def claimed(self, claimed: Claimed, options: KindOptions) -> None:
        self.keeper.hold(claimed.ticket)
        self.inner.claimed(claimed, options)

    def settled(self, attempted: Attempted) -> None:
        self.keeper.hold(None)
        self.inner.settled(attempted)


class Waker:
    """Waits for a NOTIFY on ``brooq_job`` or the poll interval, whichever comes first."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[Any] | None = None

    def wait(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds; return early when a job is enqueued."""
        try:
            if self.conn is None or self.conn.closed:
                self.conn = connect(self.dsn)
                self.conn.execute("LISTEN brooq_job")
            for _ in self.conn.notifies(timeout=timeout, stop_after=1):
                pass
        except (psycopg.Error, StoreUnavailable):
            self.conn = None
            time.sleep(timeout)

    def close(self) -> None:
        """Close the LISTEN connection."""
        if self.conn is not None:
            self.conn.close()


class InProcessWorker:
    """One slot: claim, run, settle, in the foreground until asked to stop."""

    def __init__(self, queue: Queue, config: WorkerConfig) -> None:
        self.queue, self.config = queue, config
        holder = f"{socket.gethostname()}:{os.getpid()}:work"
        self.store = PostgresStore(config.dsn, notify=queue.notify,
                                   max_payload_bytes=queue.max_payload_bytes)
        self.keeper = LeaseKeeper(PostgresStore(config.dsn), config.lease)
        self.runner = SlotRunner(self.store, queue.registry, holder, config.lease,
                                 config.topics, _KeeperListener(self.keeper, LoggingListener()))
        self.waker = Waker(config.dsn)
        self.reaper = Reaper(self.store, Every(config.reaper_period))
        self.retention = Retention(self.store, config.retention_ttl, config.retention_batch,
                                   Every(config.retention_period))
        self.stopping = False
        self.jobs = 0

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            os._exit(128 + signum)  # second signal: stop now; the lease returns the job
        self.stopping = True

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (finishing the running job first); return an exit code."""
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        self.keeper.start()
        log.info("worker started", extra={"event": "WorkerStarted",
                                          "topics": ",".join(self.runner.topics)})
        backoff = 0.5
        try:
            while not self.stopping:
                try:
                    idle = self._step()
                    backoff = 0.5
                except StoreUnavailable as exc:
                    self.keeper.hold(None)
                    log.warning("database unavailable; retrying",
                                extra={"event": "DatabaseUnavailable", "error": str(exc),
                                       "retry_in_s": backoff})
                    time.sleep(backoff)
                    backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF_S)
                    continue
                if self._finished(idle):
                    break
        finally:
            self._close()
        log.info("worker stopped", extra={"event": "WorkerExited", "jobs": self.jobs})
        return 0

    def _step(self) -> bool:
        now = time.monotonic()
        self.reaper.tick(now)
        self.retention.tick(now)
        if self.runner.run_once() is None:
            if not self.config.exit_when_idle:
                self.waker.wait(self.config.poll_interval.total_seconds())
            return True
        self.jobs += 1
        return False

    def _finished(self, idle: bool) -> bool:
        if self.config.max_jobs and self.jobs >= self.config.max_jobs:
            return True
        return idle and self.config.exit_when_idle

    def _close(self) -> None:
        self.keeper.stop()
        self.runner.close()
        self.waker.close()
        self.store.close()
