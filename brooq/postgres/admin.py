"""The Admin port over PostgreSQL: retry, cancel many, purge; batch by batch, guarded in SQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from brooq.engine.admin import (
    BATCH,
    CANCELABLE,
    PURGEABLE,
    RETARGETABLE,
    RETRYABLE,
    BulkCancel,
    require_state,
)
from brooq.engine.filters import JobFilter
from brooq.engine.outcome import clean_reason
from brooq.postgres.connect import Connector, Source
from brooq.postgres.pausing import PostgresPauses
from brooq.postgres.sql import sql
from brooq.vocabulary import parse_job_id

MAX_BATCHES = 10_000
"""A bound on any loop here: 10 million rows per call at most."""
CANCEL_RETRY_PAUSES_S = (0.25, 0.5, 1.0, 2.0)
"""After its batches, a bulk cancel that left rows (passed over locked) waits this long
and passes again, each in turn: a claim or a short transaction lets them go in milliseconds;
what is still locked after the last pause (3.75 s in all) is reported, not waited for."""


class PostgresAdmin(PostgresPauses):
    """Operators' writes on a connection of their own; each batch is its own transaction.

    A batch locks at most :data:`BATCH` rows (SKIP LOCKED: rows a worker
    holds are left alone) and commits before the next, so a purge of millions
    of rows never holds a long transaction. ``where.limit`` caps the rows a
    call changes (0: every match).
    """

    def __init__(
        self,
        source: str | ConnectionPool | psycopg.Connection[Any] | Connector,
        prepare: bool = True,
        statement_timeout: timedelta | None = None,
    ) -> None:
        self.connector = (
            source
            if isinstance(source, Connector)
            else Connector(Source(source, statement_timeout=statement_timeout, prepare=prepare))
        )

    def _batches(self, limit: int, batch: Callable[[psycopg.Connection[Any], int], int]) -> int:
        """Call ``batch(conn, want)`` until one changes fewer rows than wanted; the total.

        Each call is one statement on an autocommit connection: its own transaction.
        """
        total = 0
        with self.connector.connection() as conn:
            for _ in range(MAX_BATCHES):
                want = BATCH if not limit else min(BATCH, limit - total)
                if want <= 0:
                    break
                done = batch(conn, want)
                total += done
                if done < want:
                    break
        return total

    def retry(self, where: JobFilter) -> list[str]:
        """Dead (or canceled) jobs back to pending now (waiting while a parent has not
        ended); the ids retried.

        Each batch is one transaction of three statements: pick and lock the rows, open
        again the edges to their children (which wait for them again), then write them,
        each counting the parents it still waits for in a snapshot taken under those locks.
        """
        require_state(where, RETRYABLE, "retry")
        ids: list[str] = []

        def batch(conn: psycopg.Connection[Any], want: int) -> int:
            with conn.transaction():
                params = {**where.params(), "batch": want}
                picked = [r[0] for r in conn.execute(sql("retry_pick"), params)]
                if not picked:
                    return 0
                conn.execute(sql("retry_rearm"), {"ids": picked})
                rows = conn.execute(sql("retry_picked"), {"ids": picked}).fetchall()
            ids.extend(str(r[0]) for r in rows)
            return len(picked)

        self._batches(where.limit, batch)
        return ids

    def cancel_many(self, where: JobFilter, reason: str | None = None) -> BulkCancel:
        """Cancel every pending or failed job ``where`` matches that is not locked; how many,
        and how many were left.

        A batch passes over rows another transaction holds (SKIP LOCKED: a worker's claim,
        an open transaction), so a short batch does not mean the end: while rows are left,
        it waits (CANCEL_RETRY_PAUSES_S) and passes again. ``reason`` is checked and
        bounded as a single cancel's (InvalidJob).
        """
        if where.state is not None:
            require_state(where, CANCELABLE, "cancel")
        reason = None if reason is None else clean_reason(reason)

        def batch(conn: psycopg.Connection[Any], want: int) -> int:
            params = {**where.params(), "batch": want, "reason": reason}
            row = conn.execute(sql("cancel_jobs"), params).fetchone()
            return int(row[0]) if row else 0

        canceled = self._batches(where.limit, batch)
        for pause in CANCEL_RETRY_PAUSES_S:
            left = self._cancelable_left(where, canceled)
            if not left:
                return BulkCancel(canceled)
            time.sleep(pause)
            canceled += self._batches(where.limit - canceled if where.limit else 0, batch)
        return BulkCancel(canceled, self._cancelable_left(where, canceled))

    def _cancelable_left(self, where: JobFilter, canceled: int) -> int:
        """The rows a bulk cancel that has canceled ``canceled`` could still take."""
        if where.limit and canceled >= where.limit:
            return 0
        with self.connector.connection() as conn:
            row = conn.execute(sql("count_cancelable"), where.params()).fetchone()
        left = int(row[0]) if row else 0
        return min(left, where.limit - canceled) if where.limit else left

    def retarget(self, where: JobFilter, from_version: str | None, to_version: str | None) -> int:
        """Jobs not started yet (waiting, pending, failed) that ``where`` matches, of app
        version ``from_version``, to ``to_version`` (None: unversioned); how many. Rows a
        claim holds are passed over (it takes them as they were)."""
        if where.state is not None:
            require_state(where, RETARGETABLE, "retarget")
        versions = {"from_version": from_version, "to_version": to_version}

        def batch(conn: psycopg.Connection[Any], want: int) -> int:
            params = {**where.params(), **versions, "batch": want}
            row = conn.execute(sql("retarget_jobs"), params).fetchone()
            return int(row[0]) if row else 0

        return self._batches(where.limit, batch)

    def count_retargetable(self, where: JobFilter, from_version: str | None) -> int:
        """How many jobs a retarget of ``where`` from ``from_version`` would move now."""
        with self.connector.connection() as conn:
            params = {**where.params(), "from_version": from_version}
            row = conn.execute(sql("count_retargetable"), params).fetchone()
        return int(row[0]) if row else 0

    def purge(self, where: JobFilter) -> int:
        """Delete the terminal rows ``where`` matches in ``where.state``; how many."""
        require_state(where, PURGEABLE, "purge")

        def batch(conn: psycopg.Connection[Any], want: int) -> int:
            row = conn.execute(sql("purge_jobs"), {**where.params(), "batch": want}).fetchone()
            return int(row[0]) if row else 0

        return self._batches(where.limit, batch)

    def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> int:
        """Cancel every job of the workflow that has not ended, in one statement; how many."""
        reason = None if reason is None else clean_reason(reason)
        params = {"workflow": parse_job_id(workflow_id), "reason": reason}
        with self.connector.connection() as conn:
            row = conn.execute(sql("cancel_workflow"), params).fetchone()
        return int(row[0]) if row else 0

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel one job that is not terminal yet; a running handler hears of it."""
        reason = None if reason is None else clean_reason(reason)
        with self.connector.connection() as conn:
            row = conn.execute(
                sql("cancel"), {"id": parse_job_id(job_id), "reason": reason}
            ).fetchone()
        return row is not None

    def close(self) -> None:
        """Close the connection this admin opened."""
        self.connector.close()
