"""``brooq work``: one slot in this process, in the foreground, until SIGTERM/SIGINT.

The handler runs in the main thread (soft interrupts work). A keeper thread
with its own connections keeps the lease and LISTENs for cancels, so a
canceled job is interrupted as fast as under ``brooq supervise``; LISTEN
wakes the idle slot. The slot also runs the reaper, retention and the
partitions ahead, so a lone worker needs nothing else. For isolation per
process, use ``brooq supervise``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType

from brooq.config import Settings
from brooq.engine.partitions import PartitionUpkeep
from brooq.engine.reaper import Reaper
from brooq.engine.retention import Retention
from brooq.engine.runner import Attempted, RunListener, SlotRunner
from brooq.engine.store import Claimed, Store, Ticket
from brooq.engine.timer import Every
from brooq.logs import LoggingListener, event, listen_off
from brooq.postgres.listen import Listener
from brooq.postgres.store import PostgresStore
from brooq.queue import Queue
from brooq.vocabulary import KindOptions, StoreUnavailable, holder_id

log = logging.getLogger("brooq.worker")

MAX_RECONNECT_BACKOFF_S = 30.0
FATAL_MARKERS = (
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "permission denied",
)
"""Errors that waiting does not fix: the worker stops instead of retrying forever."""


@dataclass(frozen=True)
class RunOptions:
    """What ``brooq work`` was asked beyond the settings."""

    topics: Sequence[str] | None = None
    max_jobs: int = 0
    exit_when_idle: bool = False


class Keeper(threading.Thread):
    """Extends the running job's lease every lease/3 and interrupts its handler when the job
    is canceled (NOTIFY) or its lease is lost."""

    def __init__(
        self, store: Store, dsn: str | None, lease: timedelta, pooled: bool = False
    ) -> None:
        super().__init__(name="brooq-keeper", daemon=True)
        self.store, self.lease = store, lease
        self.cancels = Listener(dsn, jobs=False, pooled=pooled)
        self._ticket: Ticket | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next_beat = 0.0

    def hold(self, ticket: Ticket | None) -> None:
        """Start (or with None stop) keeping ``ticket``'s lease."""
        with self._lock:
            self._ticket = ticket
            self._next_beat = time.monotonic() + self.lease.total_seconds() / 3

    def run(self) -> None:
        """Listen for cancels and heartbeat until stopped."""
        while not self._stop.is_set():
            wait = max(0.05, min(1.0, self._next_beat - time.monotonic()))
            heard = self.cancels.wait(timedelta(seconds=wait))
            if self.cancels.conn is None:
                self._stop.wait(wait)
            with self._lock:
                ticket = self._ticket
            if ticket is not None and ticket.job_id in heard.canceled:
                self._interrupt(ticket, signal.SIGUSR2)
            elif ticket is not None and time.monotonic() >= self._next_beat:
                self._beat(ticket)

    def _beat(self, ticket: Ticket) -> None:
        self._next_beat = time.monotonic() + self.lease.total_seconds() / 3
        try:
            kept = self.store.heartbeat([ticket], self.lease)
        except StoreUnavailable as exc:
            event(log, "HeartbeatFailed", logging.WARNING, error=str(exc))
            return
        if ticket.job_id not in kept:
            self._interrupt(ticket, signal.SIGUSR1)

    def _interrupt(self, ticket: Ticket, signum: int) -> None:
        with self._lock:
            if self._ticket != ticket:
                return
            self._ticket = None
        signal.pthread_kill(threading.main_thread().ident or 0, signum)

    def stop(self) -> None:
        """End the thread."""
        self._stop.set()
        self.cancels.close()


class _KeeperListener:
    """Ties the keeper to the slot's claims, then forwards to the log listener."""

    def __init__(self, keeper: Keeper, inner: RunListener) -> None:
        self.keeper, self.inner = keeper, inner

    def claimed(self, claimed: Claimed, options: KindOptions) -> None:
        self.keeper.hold(claimed.ticket)
        self.inner.claimed(claimed, options)

    def settled(self, attempted: Attempted) -> None:
        self.keeper.hold(None)
        self.inner.settled(attempted)


class InProcessSlot:
    """One slot: claim, run, settle, in the foreground until asked to stop."""

    def __init__(self, queue: Queue, settings: Settings, dsn: str, options: RunOptions) -> None:
        self.queue, self.settings, self.options = queue, settings, options
        # The version it claims as, and stamps on what its handlers enqueue (as a supervisor).
        queue.app_version = settings.app_version or queue.app_version
        self.store = PostgresStore(
            dsn,
            notify=settings.notify,
            max_payload_bytes=settings.max_payload_bytes,
            app_version=queue.app_version,
        )
        listen = settings.listen_dsn(dsn)
        if listen is None:
            listen_off(settings.poll_interval)
        pooled = not settings.listen_url  # LISTEN on DATABASE_URL: off once a bouncer shows
        self.keeper = Keeper(PostgresStore(dsn), listen, settings.lease, pooled)
        self.runner = SlotRunner(
            self.store,
            queue.registry,
            holder_id(),
            settings.lease,
            options.topics,
            _KeeperListener(self.keeper, LoggingListener(every_job=settings.log_jobs)),
            max_result_bytes=settings.max_result_bytes,
        )
        self.waker = Listener(listen, cancels=False, pooled=pooled)
        self.reaper = Reaper(self.store, Every(settings.reaper_period), settings.max_expirations)
        self.retention = Retention(
            self.store,
            settings.retention_ttl,
            settings.retention_batch,
            Every(settings.retention_period),
            partition_interval=settings.partition_interval,
        )
        self.partitions = PartitionUpkeep(self.store, settings.partition_interval)
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
        event(log, "WorkerStarted", topics=",".join(self.runner.topics))
        backoff = 0.5
        try:
            while not self.stopping:
                try:
                    idle = self._step()
                    backoff = 0.5
                except StoreUnavailable as exc:
                    self.keeper.hold(None)
                    if any(marker in str(exc) for marker in FATAL_MARKERS):
                        event(
                            log,
                            "WorkerStopped",
                            logging.ERROR,
                            error=str(exc),
                            note="waiting cannot fix this; check DATABASE_URL",
                        )
                        return 1
                    event(
                        log,
                        "DatabaseUnavailable",
                        logging.WARNING,
                        error=str(exc),
                        retry_in_s=backoff,
                    )
                    self._sleep(backoff)
                    backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF_S)
                    continue
                if self._finished(idle):
                    break
        finally:
            self._close()
        event(log, "WorkerExited", jobs=self.jobs)
        return 0

    def _sleep(self, seconds: float) -> None:
        """Sleep in short slices, so Ctrl-C stops the worker within a fraction of a second."""
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, deadline - time.monotonic()))

    def _step(self) -> bool:
        now = time.monotonic()
        self.reaper.tick(now)
        self.retention.tick(now)
        self.partitions.tick(now)
        if self.runner.run_once() is None:
            if not self.options.exit_when_idle:
                self._wait_for_jobs()
            return True
        self.jobs += 1
        return False

    def _wait_for_jobs(self) -> None:
        """Until a NOTIFY, the poll interval, a rate limit's next token, or a stop signal
        (checked every second)."""
        wait = self.settings.poll_interval.total_seconds()
        if (token := self.runner.next_token_in) is not None:
            wait = min(wait, token)
        deadline = time.monotonic() + wait
        while not self.stopping and (left := deadline - time.monotonic()) > 0:
            if self.waker.wait(timedelta(seconds=min(left, 1.0))).topics:
                return
            if self.waker.conn is None:
                self._sleep(min(left, 1.0))  # no LISTEN while the database is away

    def _finished(self, idle: bool) -> bool:
        if self.options.max_jobs and self.jobs >= self.options.max_jobs:
            return True
        return idle and self.options.exit_when_idle

    def _close(self) -> None:
        self.keeper.stop()
        self.runner.close()
        self.waker.close()
        self.store.close()
