"""LISTEN in one place: the channels brooq NOTIFYs, read without blocking the caller.

A LISTEN needs a session of its own, which a transaction-pooling PgBouncer
cannot give: its server connection goes back to the pool after the LISTEN,
and what is notified there is lost ("got packet 'A' from server when not
linked"). So a LISTEN on DATABASE_URL itself (no QUEUE_LISTEN_URL: *pooled*)
happens only while no PgBouncer is known: its connection carries the startup
option a bouncer refuses (the signature brooq.postgres.connect detects), and
once a bouncer is detected — by that connection or any other of the process —
it stops for good and says so once (``ListenOff``): exactly the profile of
QUEUE_PGBOUNCER=true without QUEUE_LISTEN_URL.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg

from brooq.postgres.connect import PROFILE, connect
from brooq.postgres.sql import sql
from brooq.vocabulary import StoreUnavailable

log = logging.getLogger("brooq.listen")

JOB_CHANNEL = "brooq_job"
CANCEL_CHANNEL = "brooq_cancel"
PAUSE_CHANNEL = "brooq_pause"
PROBE_TIMEOUT = timedelta(seconds=60)
"""The statement_timeout a pooled LISTEN connection starts with: the startup option a
transaction-pooling PgBouncer refuses, which gives it away before anything is LISTENed."""
LISTEN_OFF = (
    "DATABASE_URL goes through a transaction-pooling PgBouncer (detected): no LISTEN "
    "through it (its notifications would be lost); new jobs are looked for every poll "
    "interval, cancels of running jobs are learned at the next heartbeat (lease/3), result "
    "waiters read their rows every second; set QUEUE_LISTEN_URL to a direct URL to LISTEN"
)
_said_off = False


def listen_connection(
    dsn: str, statements: Sequence[str], pooled: bool
) -> psycopg.Connection[Any] | None:
    """An autocommit connection to ``dsn`` that ran the LISTEN ``statements``; None when
    ``dsn`` is DATABASE_URL itself (``pooled``) and goes through a transaction pooler.
    StoreUnavailable or psycopg.Error while the database is away."""
    if pooled and PROFILE.pgbouncer:
        _off()
        return None
    conn = connect(dsn, statement_timeout=PROBE_TIMEOUT if pooled else None)
    try:
        if pooled and PROFILE.pgbouncer:  # this very connect gave the bouncer away
            conn.close()
            _off()
            return None
        for statement in statements:
            conn.execute(statement)
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            conn.close()
        raise
    return conn


def _off() -> None:
    """Say once per process that LISTEN is off since a bouncer was detected."""
    global _said_off
    if not _said_off:
        _said_off = True
        log.warning(LISTEN_OFF, extra={"event": "ListenOff", "note": LISTEN_OFF})


@dataclass
class Heard:
    """What arrived since the last read: topics with new jobs, ids of canceled jobs, and
    whether a topic was paused or resumed."""

    topics: set[str] = field(default_factory=set)
    canceled: set[str] = field(default_factory=set)
    pauses: bool = False

    def __bool__(self) -> bool:
        return bool(self.topics or self.canceled or self.pauses)

    def add(self, channel: str, payload: str) -> None:
        """Take in one notification."""
        if channel == JOB_CHANNEL:
            self.topics.add(payload)
        elif channel == PAUSE_CHANNEL:
            self.pauses = True
        else:
            self.canceled.add(payload)

    def merge(self, more: Heard) -> None:
        """Take in what ``more`` heard."""
        self.topics |= more.topics
        self.canceled |= more.canceled
        self.pauses = self.pauses or more.pauses


class Listener:
    """A connection of its own that LISTENs to new jobs and cancels.

    ``fileno()`` gives the socket to wait on (connecting when needed, None
    while the database is down, and for good once ``dsn`` is None); ``read()``
    returns what arrived, never blocking. A LISTEN needs a session: through a
    transaction-pooling bouncer give a direct DSN (QUEUE_LISTEN_URL); a pooled
    one stops once a bouncer is detected (see the module's docstring).
    """

    def __init__(
        self,
        dsn: str | None,
        *,
        jobs: bool = True,
        cancels: bool = True,
        pauses: bool = False,
        pooled: bool = False,
    ) -> None:
        self.dsn = dsn
        """None: no LISTEN at all (a bouncer's DSN and no QUEUE_LISTEN_URL); callers poll."""
        self.pooled = pooled
        """``dsn`` is DATABASE_URL itself: LISTEN there only while no PgBouncer is detected."""
        channels = (("listen_jobs", jobs), ("listen_cancels", cancels), ("listen_pauses", pauses))
        self.statements = [sql(n) for n, on in channels if on]
        self.conn: psycopg.Connection[object] | None = None
        self.missed = False
        """True after a reconnect: notifications may have been lost meanwhile."""

    def fileno(self) -> int | None:
        """The socket to wait on, connecting (and LISTENing) when needed; None while down."""
        if self.dsn is None:
            return None
        if self.pooled and PROFILE.pgbouncer:
            self.close()  # detected by another connection of the process since
            self.dsn = None
            _off()
            return None
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = None
            try:
                conn = listen_connection(self.dsn, self.statements, self.pooled)
            except (StoreUnavailable, psycopg.Error):
                return None
            if conn is None:
                self.dsn = None
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
                heard.add(note.channel, note.payload)
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
                heard.add(note.channel, note.payload)
        except psycopg.Error:
            self.close()
            return heard
        heard.merge(self.read())
        return heard

    def close(self) -> None:
        """Close the LISTEN connection."""
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self.conn = None
