"""LISTEN in one place: the channels brooq NOTIFYs, read without blocking the caller."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import timedelta

import psycopg

from brooq.postgres.connect import connect
from brooq.postgres.sql import sql
from brooq.vocabulary import StoreUnavailable

JOB_CHANNEL = "brooq_job"
CANCEL_CHANNEL = "brooq_cancel"


@dataclass
class Heard:
    """What arrived since the last read: topics with new jobs, ids of canceled jobs."""

    topics: set[str] = field(default_factory=set)
    canceled: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.topics or self.canceled)


class Listener:
    """A connection of its own that LISTENs to new jobs and cancels.

    ``fileno()`` gives the socket to wait on (connecting when needed, None
    while the database is down); ``read()`` returns what arrived, never
    blocking. A LISTEN needs a session: through a transaction-pooling bouncer
    give a direct DSN (QUEUE_LISTEN_URL).
    """

    def __init__(self, dsn: str | None, *, jobs: bool = True, cancels: bool = True) -> None:
        self.dsn = dsn
        """None: no LISTEN at all (a bouncer's DSN and no QUEUE_LISTEN_URL); callers poll."""
        self.statements = [
            sql(n) for n, on in (("listen_jobs", jobs), ("listen_cancels", cancels)) if on
        ]
        self.conn: psycopg.Connection[object] | None = None
        self.missed = False
        """True after a reconnect: notifications may have been lost meanwhile."""

    def fileno(self) -> int | None:
        """The socket to wait on, connecting (and LISTENing) when needed; None while down."""
        if self.dsn is None:
            return None
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = None
            try:
                conn = connect(self.dsn)
                for statement in self.statements:
                    conn.execute(statement)
            except (StoreUnavailable, psycopg.Error):
                return None
            self.conn, self.missed = conn, True
        return self.conn.fileno()

    def read(self) -> Heard:
        """Notifications that arrived; empty when there are none or the connection broke."""
        heard = Heard()
        if self.conn is None:
            return heard
        try:
            for note in self.conn.notifies(timeout=0):
                (heard.topics if note.channel == JOB_CHANNEL else heard.canceled).add(note.payload)
        except psycopg.Error:
            self.close()
        return heard

    def wait(self, timeout: timedelta) -> Heard:
        """Block up to ``timeout`` for a notification (for a single-threaded worker)."""
        if self.fileno() is None or self.conn is None:
            return Heard()
        heard = Heard()
        try:
            for note in self.conn.notifies(timeout=timeout.total_seconds(), stop_after=1):
                (heard.topics if note.channel == JOB_CHANNEL else heard.canceled).add(note.payload)
        except psycopg.Error:
            self.close()
            return heard
        more = self.read()
        heard.topics |= more.topics
        heard.canceled |= more.canceled
        return heard

    def close(self) -> None:
        """Close the LISTEN connection."""
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self.conn = None
