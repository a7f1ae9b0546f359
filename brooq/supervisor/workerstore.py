"""A worker's own database connection: opened on first need, closed once unused for a while.

A worker needs a connection of its own only to settle jobs with effects
(``chain``, ``on_succeeded``) and when a handler reads ``claim.parents``.
Kept open for good, a supervisor whose workers once ran such a job holds one
connection per worker more than its three while they run plain jobs or wait.
So the connection is closed once it went unused for
``QUEUE_WORKER_CONNECTION_IDLE`` (1 min by default); the next job that needs
it opens it again. The worker looks between jobs (one clock read, and only
while a connection is open) and, while it waits for work, through the
timeout of its wait: one wake-up per idle period, never one per job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from brooq.postgres.store import PostgresStore

if TYPE_CHECKING:  # the worker's module imports this one
    from brooq.supervisor.child import WorkerConfig


class WorkerStore:
    """The worker's store and the life of its connection."""

    def __init__(self, config: WorkerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.clock = config, clock
        self.idle_s = config.connection_idle_s
        self._store: PostgresStore | None = None
        self.touched = False
        """The store was used since the last look (the job that just ended used it)."""
        self.used_at = 0.0
        """When the connection was last used, as of the last look (monotonic)."""

    @property
    def store(self) -> PostgresStore:
        """The worker's own store (connecting on first use); every use keeps it open longer."""
        if self._store is None:
            c = self.config
            self._store = PostgresStore(
                c.dsn,
                notify=c.notify,
                max_payload_bytes=c.max_payload_bytes,
                prepare=c.prepare,
                statement_timeout=c.statement_timeout,
                idle_timeout=c.idle_timeout,
                app_version=c.app_version,
            )
        self.touched = True
        return self._store

    def fileno(self) -> int | None:
        """The socket of the worker's connection while it is open."""
        return None if self._store is None else self._store.connector.fileno()

    def forget(self) -> None:
        """Drop the connection unclosed: a handler closed its descriptor (see Worker.check_fds)."""
        if self._store is not None:
            self._store.connector.forget()

    def look(self) -> float | None:
        """Close the connection if it went unused for the idle bound; the seconds left until
        it is due, or None when no connection is open (nothing to wait for)."""
        if self._store is None:
            return None  # never needed one: no clock read either
        now = self.clock()
        if self.touched:
            self.used_at, self.touched = now, False
        if self._store.connector.fileno() is None:
            return None
        left = self.used_at + self.idle_s - now
        if left > 0:
            return left
        self._store.close()
        return None
