"""The PostgreSQL store's upkeep: the reaper, retention (rows and whole partitions), the
partitions created ahead, and the schedules' reads. The statements of the supervisor's
maintenance service, apart from the hot path of enqueue, claim and settle (store.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from brooq.engine.store import DroppedPartition, Requeued, TopicCount
from brooq.postgres.connect import Connector
from brooq.postgres.rows import Row, like_prefix, topic_counts
from brooq.postgres.sql import sql
from brooq.vocabulary import Schedule

DEADLOCK_RETRIES = 5

REAP_FULL_S = 60.0
"""How often the reaper reads every expired lease, not only the recent ones (ReapWindow)."""
REAP_SLACK = timedelta(seconds=5)
"""How far before the previous run a windowed run starts reading."""


class ReapWindow:
    """Which leases a reaper run reads: those that ran out since shortly before its
    previous run, and all of them every REAP_FULL_S (and at the first run, and after a
    run cut short by its batch). A lease that ran out before the previous run was
    requeued by it, unless another session held its row then: the next full run takes it.

    Why not always all: job_processing_idx keeps an entry for every processing version,
    and while a session holds a snapshot open the entries of every job settled since
    stay, their `locked_until` in the past: a run reading from the start of the index
    walks all of them (docs/architecture.md, "Claims from floors")."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: float | None = None
        self._full = 0.0

    def window(self) -> tuple[float, timedelta | None]:
        """The run's start (by ``clock``) and how far back from the database's now() it
        reads (None: every expired lease)."""
        now = self._clock()
        if self._last is None or now - self._full >= REAP_FULL_S:
            return now, None
        return now, timedelta(seconds=now - self._last) + REAP_SLACK

    def ran(self, started: float, window: timedelta | None, cut: bool) -> None:
        """Record a run: started at ``started``, reading ``window``; ``cut`` if its batch
        came back full (the next run reads everything: it may have left some behind)."""
        if cut:
            self._last = None
            return
        self._last = started
        if window is None:
            self._full = started


def retrying(
    connector: Connector, statement: str, params: dict[str, Any], fetch: bool = True
) -> list[Row]:
    """The rows of ``statement``, run again when PostgreSQL aborted it for a deadlock (it
    rolled back whole; the fence of every brooq write makes running it again safe)."""
    with connector.connection() as conn:
        # Inside a transaction (through PgBouncer the connector opens one per operation
        # for its SET LOCAL), each try is a savepoint, so a deadlock victim can retry.
        nested = conn.info.transaction_status != TransactionStatus.IDLE
        for attempt in range(DEADLOCK_RETRIES):
            try:
                with conn.transaction() if nested else contextlib.nullcontext():
                    cur = conn.execute(statement, params)
                    return cur.fetchall() if fetch else []
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                if attempt == DEADLOCK_RETRIES - 1:
                    raise
                time.sleep(0.001 * (attempt + 1))
    return []


def _unless_locked(
    conn: psycopg.Connection[Any], statement: str, params: dict[str, Any]
) -> list[Row] | None:
    """The rows of a statement that waits for its locks at most a moment (lock_timeout);
    None when a lock was busy: the statement did nothing, and the next tick tries again."""
    nested = conn.info.transaction_status != TransactionStatus.IDLE
    try:
        with conn.transaction() if nested else contextlib.nullcontext():
            return conn.execute(statement, params).fetchall()
    except psycopg.errors.LockNotAvailable:
        return None


class PostgresUpkeep:
    """The maintenance half of PostgresStore (it holds the ``connector``)."""

    connector: Connector
    reap_window: ReapWindow

    def requeue_expired(self, max_expirations: int = 0, batch: int = 1000) -> Requeued:
        """The reaper's one statement: at most ``batch`` expired leases, attempts untouched
        (of those expired recently, and of all of them every REAP_FULL_S: ReapWindow)."""
        started, window = self.reap_window.window()
        params = {"max_expirations": max_expirations, "batch": batch, "window": window}
        rows = retrying(self.connector, sql("requeue_expired"), params)
        self.reap_window.ran(started, window, len(rows) >= batch)
        return Requeued(
            topic_counts(t for t, s in rows if s == "pending"),
            topic_counts(t for t, s in rows if s == "dead"),
        )

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[TopicCount]:
        """Delete one batch of terminal rows older than ``ttl`` in its own transaction."""
        if ttl <= timedelta(0):
            raise ValueError("retention TTL must be positive; 0 disables retention")
        with self.connector.connection() as conn, conn.transaction():
            rows = conn.execute(sql("delete_terminal"), {"ttl": ttl, "batch": batch}).fetchall()
        return topic_counts(r[0] for r in rows)

    def add_partitions(self, step: timedelta, ahead: timedelta, most: int) -> list[str]:
        """Create partitions up to now + ``ahead`` (brooq_job_create_partitions); their names."""
        params = {"step": step, "ahead": ahead, "most": most}
        with self.connector.connection() as conn:
            rows = _unless_locked(conn, sql("add_partitions"), params)
        return [str(r[0]) for r in rows or []]

    def drop_partitions(self, ttl: timedelta, most: int) -> list[DroppedPartition]:
        """Drop the partitions retention may take, each in its own transaction."""
        if ttl <= timedelta(0):
            raise ValueError("retention TTL must be positive; 0 disables retention")
        with self.connector.connection() as conn:
            params: dict[str, Any] = {"ttl": ttl, "most": most}
            names = [str(r[0]) for r in conn.execute(sql("partitions_past_ttl"), params)]
        dropped = []
        for name in names:
            with self.connector.connection() as conn:
                rows = _unless_locked(conn, sql("drop_partition"), {"name": name, "ttl": ttl})
            if rows and rows[0][0] is not None:
                dropped.append(DroppedPartition(name, int(rows[0][0])))
        return dropped

    def last_scheduled_run(self, schedule: Schedule) -> datetime | None:
        """When the latest run of ``schedule`` still in the table was due."""
        params = {"topic": schedule.topic, "key_prefix": like_prefix(schedule.key_prefix)}
        with self.connector.connection() as conn:
            row = conn.execute(sql("last_scheduled_run"), params).fetchone()
        return row[0] if row else None
