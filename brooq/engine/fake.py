"""An in-memory Store with the PostgreSQL store's semantics, for unit tests.

The same contract tests and state machine run against this fake and the real
store, so what passes here is known to hold there. Time comes from an
injectable clock, so tests can expire leases without sleeping.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from brooq.engine.outcome import Outcome, SettleKind, clean_reason
from brooq.engine.store import Claimed, SettleHookFailed, Ticket, TopicCount
from brooq.vocabulary import (
    CLAIMABLE_STATES,
    TERMINAL_STATES,
    Enqueued,
    Job,
    JobNotFound,
    JobRecord,
    Schedule,
    SettleHook,
    State,
    decode_payload,
    encode_payload,
    new_job_id,
    parse_job_id,
)


@dataclass
class FakeTransaction:
    """What a settle hook receives from the fake store in place of a connection."""

    store: InMemoryStore
    effects: list[Any]

    def record(self, effect: Any) -> None:
        """Keep ``effect``; it becomes visible in ``store.effects`` only on commit."""
        self.effects.append(effect)


class InMemoryStore:
    """A thread-safe in-memory implementation of the Store port."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self.rows: dict[str, JobRecord] = {}
        self.effects: list[Any] = []
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.RLock()

    def now(self) -> datetime:
        """The store's current time."""
        return self._clock()

    def enqueue_many(self, jobs: Sequence[Job], conn: Any = None) -> list[Enqueued]:
        """Insert jobs, deduplicating per (topic, idempotency_key)."""
        with self._lock:
            return [self._enqueue_one(job) for job in jobs]

    def _enqueue_one(self, job: Job) -> Enqueued:
        if job.idempotency_key is not None:
            for row in self.rows.values():
                if row.topic == job.topic and row.idempotency_key == job.idempotency_key:
                    return Enqueued(row.id, False)
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
            last_error=None,
            created_at=now,
            updated_at=now,
        )
        self.rows[row.id] = row
        return Enqueued(row.id, True)

    def claim(
        self, holder: str, topics: Sequence[str], lease: timedelta,
        limits: Mapping[str, int] | None = None,
    ) -> Claimed | None:
        """Take the ready row of ``topics`` first by (priority desc, available_at, id)."""
        return self._claim(holder, topics, lease, limits)

    def _claim(
        self, holder: str, topics: Sequence[str], lease: timedelta,
        limits: Mapping[str, int] | None = None, skip: str | None = None,
    ) -> Claimed | None:
        with self._lock:
            now = self.now()
            limits = limits or {}
            running = Counter(r.topic for r in self.rows.values() if r.state is State.PROCESSING)
            ready = [
                r for r in self.rows.values()
                if r.state in CLAIMABLE_STATES and r.available_at <= now and r.topic in topics
                and r.id != skip
                and (r.topic not in limits or running[r.topic] < limits[r.topic])
            ]
            if not ready:
                return None
            row = min(ready, key=lambda r: (-r.priority, r.available_at, r.id))
            row = replace(
                row, state=State.PROCESSING, locked_by=holder, locked_until=now + lease,
                attempts=row.attempts + 1, updated_at=now,
            )
            self.rows[row.id] = row
            assert row.locked_until is not None
            return Claimed(Ticket(row.id, holder, row.attempts), row.topic, row.payload,
                           row.locked_until)

    def settle_and_claim(
        self, ticket: Ticket, outcome: Outcome, topics: Sequence[str], lease: timedelta,
    ) -> tuple[bool, Claimed | None]:
        """Settle, then claim, atomically.

        Like PostgreSQL's single statement, the claim never takes back the row
        just settled: it was still processing in the statement's snapshot.
        """
        with self._lock:
            written = self.settle(ticket, outcome)
            skip = ticket.job_id if written else None
            return written, self._claim(ticket.holder, topics, lease, skip=skip)

    def last_scheduled_run(self, schedule: Schedule) -> datetime | None:
        """The latest available_at among rows keyed by ``schedule``."""
        with self._lock:
            times = [r.available_at for r in self.rows.values()
                     if r.topic == schedule.topic and r.idempotency_key
                     and r.idempotency_key.startswith(schedule.key_prefix)]
            return max(times, default=None)

    def _held(self, ticket: Ticket) -> JobRecord | None:
        row = self.rows.get(ticket.job_id)
        if (row is None or row.state is not State.PROCESSING or row.locked_by != ticket.holder
                or row.attempts != ticket.attempt):
            return None
        return row

    def settle(
        self,
        ticket: Ticket,
        outcome: Outcome,
        chain: Sequence[Job] = (),
        hooks: Sequence[SettleHook] = (),
    ) -> bool:
        """Write the outcome if the ticket still holds the row."""
        with self._lock:
            row = self._held(ticket)
            if row is None or outcome.kind is SettleKind.ABANDON:
                return False
            now = self.now()
            changes: dict[str, Any] = {"state": outcome.state, "updated_at": now}
            if outcome.error is not None:
                changes["last_error"] = outcome.error
            if outcome.refund_attempt:
                changes["attempts"] = max(row.attempts - 1, 0)
            if outcome.kind is SettleKind.FAILED:
                changes["available_at"] = now + (outcome.retry_in or timedelta(0))
            if outcome.kind is SettleKind.DONE:
                self._run_hooks(chain, hooks)
            self.rows[row.id] = replace(row, **changes)
            return True

    def _run_hooks(self, chain: Sequence[Job], hooks: Sequence[SettleHook]) -> None:
        tx = FakeTransaction(self, [])
        saved = dict(self.rows)
        try:
            for job in chain:
                self._enqueue_one(job)
            for hook in hooks:
                hook(tx)
        except BaseException as exc:
            # Like the real transaction: any exception rolls back what the hooks wrote.
            self.rows = saved
            if not isinstance(exc, Exception):
                raise
            raise SettleHookFailed(str(exc)) from exc
        self.effects.extend(tx.effects)

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        """Extend the leases still held by their tickets."""
        with self._lock:
            kept = set()
            for ticket in tickets:
                row = self._held(ticket)
                if row is not None:
                    self.rows[row.id] = replace(row, locked_until=self.now() + lease)
                    kept.add(row.id)
            return kept

    def release(self, tickets: Sequence[Ticket]) -> set[str]:
        """Return held rows to pending and give back their attempt."""
        with self._lock:
            released = set()
            now = self.now()  # one statement in PostgreSQL: one now() for every row
            for ticket in tickets:
                row = self._held(ticket)
                if row is not None:
                    self.rows[row.id] = replace(
                        row, state=State.PENDING, attempts=max(row.attempts - 1, 0),
                        locked_by=None, locked_until=None, available_at=now, updated_at=now,
                    )
                    released.add(row.id)
            return released

    def requeue_expired(self) -> list[TopicCount]:
        """Return expired processing rows to pending; attempts untouched."""
        with self._lock:
            now = self.now()
            counts: dict[str, int] = {}
            for row in list(self.rows.values()):
                if (row.state is State.PROCESSING and row.locked_until is not None
                        and row.locked_until < now):
                    self.rows[row.id] = replace(
                        row, state=State.PENDING, locked_by=None, locked_until=None,
                        available_at=now, updated_at=now,
                    )
                    counts[row.topic] = counts.get(row.topic, 0) + 1
            return [TopicCount(t, n) for t, n in sorted(counts.items())]

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[TopicCount]:
        """Delete up to ``batch`` terminal rows older than ``ttl``, oldest first."""
        if ttl <= timedelta(0):
            raise ValueError("retention TTL must be positive; 0 disables retention")
        with self._lock:
            cutoff = self.now() - ttl
            old = sorted(
                (r for r in self.rows.values()
                 if r.state in TERMINAL_STATES and r.updated_at < cutoff),
                key=lambda r: r.updated_at,
            )[:batch]
            counts: dict[str, int] = {}
            for row in old:
                del self.rows[row.id]
                counts[row.topic] = counts.get(row.topic, 0) + 1
            return [TopicCount(t, n) for t, n in sorted(counts.items())]

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a non-terminal job; False when it is already terminal."""
        with self._lock:
            row = self.get(job_id)
            if row.state in TERMINAL_STATES:
                return False
            if reason is not None:  # as PostgreSQL stores it: '' is a reason too
                reason = "canceled: " + clean_reason(reason)
            self.rows[row.id] = replace(
                row, state=State.CANCELED, updated_at=self.now(),
                last_error=reason if reason is not None else row.last_error,
            )
            return True

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
