"""The in-memory store's table: its rows, its clock and lock, and the reads every half shares."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from brooq.engine.fake.buckets import Buckets
from brooq.engine.fake.recording import Executed
from brooq.engine.fake.turns import FairTurns
from brooq.engine.results import wait_for_result
from brooq.engine.store import Ticket
from brooq.vocabulary import (
    Enqueued,
    Job,
    JobNotFound,
    JobRecord,
    State,
    TopicPause,
    decode_payload,
    encode_payload,
    new_job_id,
    parse_job_id,
)
from brooq.vocabulary import app_version as app_version_of


class FakeTable:
    """The rows of the in-memory ``job`` table, guarded by one lock, on an injectable clock."""

    def __init__(
        self, clock: Callable[[], datetime] | None = None, app_version: str | None = None
    ) -> None:
        self.app_version = app_version_of(app_version)
        """Stamped on every job it enqueues; its claims take that version's and none's."""
        self.rows: dict[str, JobRecord] = {}
        self.executed: list[Executed] = []
        """Statements that committed settle hooks ran on their RecordingConnection."""
        self.buckets = Buckets()
        """The rate limits' buckets (the ``brooq_rate_limit`` table)."""
        self.turns = FairTurns()
        """The fair topics' cursors (the ``brooq_fair_cursor`` table)."""
        self.paused: dict[str, TopicPause] = {}
        """Paused topics (the ``brooq_topic_pause`` table)."""
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._version = 0
        """Counts the writes that may end a job (settles, cancels, the reaper)."""

    def now(self) -> datetime:
        """The store's current time."""
        return self._clock()

    def get(self, job_id: str) -> JobRecord:
        """The row of ``job_id``; JobNotFound when there is none."""
        try:
            key = parse_job_id(job_id)
        except ValueError as exc:
            raise JobNotFound(str(exc)) from None
        with self._lock:
            try:
                return self.rows[key]
            except KeyError:
                raise JobNotFound(f"no job with id {key}") from None

    def _ended_some(self) -> None:
        """A write that may have ended jobs: wake whoever waits for a result."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """The decoded result of a ``done`` job, waiting up to ``timeout`` seconds for the job
        to end (another thread drains); JobDead/JobCanceled, ResultTimeout, JobNotFound."""
        seen = [-1]

        def get(key: str) -> JobRecord:
            with self._lock:
                seen[0] = self._version
                return self.get(key)

        def wait(seconds: float) -> None:
            with self._changed:
                self._changed.wait_for(lambda: self._version != seen[0], seconds)

        return wait_for_result(job_id, get, wait, timeout)

    async def result_async(self, job_id: str, timeout: float | None = None) -> Any:
        """:meth:`result` for asyncio tests (it waits in a thread)."""
        return await asyncio.to_thread(self.result, job_id, timeout)

    def _held(self, ticket: Ticket) -> JobRecord | None:
        row = self.rows.get(ticket.job_id)
        if (
            row is None
            or row.state is not State.PROCESSING
            or row.locked_by != ticket.holder
            or row.attempts != ticket.attempt
        ):
            return None
        return row

    def _enqueue_one(self, job: Job) -> Enqueued:
        if job.idempotency_key is not None:
            for row in self.rows.values():
                if row.topic == job.topic and row.idempotency_key == job.idempotency_key:
                    return Enqueued(row.id, False, row.state)
        now = self.now()
        row = JobRecord(
            id=new_job_id(),
            topic=job.topic,
            payload=decode_payload(encode_payload(job.payload)),
            state=State.PENDING,
            attempts=0,
            available_at=job.available_at or now,
            locked_by=None,
            locked_until=None,
            idempotency_key=job.idempotency_key,
            priority=job.priority,
            rate_key=job.rate_key,
            app_version=self.app_version,
            **job.controls(),
            last_error=None,
            created_at=now,
            updated_at=now,
        )
        self.rows[row.id] = row
        return Enqueued(row.id, True)

    def _give_back(self, rows: list[JobRecord], now: datetime) -> set[str]:
        """Return held rows to pending, uncharged; their rate limits' tokens go back too
        (counted per bucket, as the one statement of PostgreSQL rounds them). A row named
        twice (the same ticket twice) is given back once, as PostgreSQL updates it once."""
        rows = list({row.id: row for row in rows}.values())
        for at, n in Counter((row.topic, row.rate_key or "") for row in rows).items():
            self.buckets.refund(at, n, now)
        for row in rows:
            self._return(row, now)
        return {row.id for row in rows}

    def _return(self, row: JobRecord, now: datetime) -> None:
        self.rows[row.id] = replace(
            row,
            state=State.PENDING,
            attempts=max(row.attempts - 1, row.expirations),
            locked_by=None,
            locked_until=None,
            available_at=now,
            updated_at=now,
        )
