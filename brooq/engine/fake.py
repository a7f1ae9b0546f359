"""An in-memory Store with the PostgreSQL store's semantics, for unit tests.

The same contract tests and state machine run against this fake and the real
store, so what passes here is known to hold there. Where the fake cannot
behave like PostgreSQL it fails loudly instead of pretending: it cannot join
a caller's transaction (``enqueue(conn=…)``), and settle hooks get a
:class:`RecordingConnection` that records each statement instead of running
it. Time comes from an injectable clock, so tests can expire leases without
sleeping.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from brooq.engine.outcome import Outcome, SettleKind, clean_reason
from brooq.engine.store import Claimed, Requeued, SettleHookFailed, Ticket, TopicCount
from brooq.vocabulary import (
    CLAIMABLE_STATES,
    TERMINAL_STATES,
    Enqueued,
    Job,
    JobNotFound,
    JobRecord,
    NeedsDatabase,
    Schedule,
    SettleHook,
    State,
    decode_payload,
    encode_payload,
    new_job_id,
    parse_job_id,
)


@dataclass(frozen=True, slots=True)
class Executed:
    """One statement a settle hook ran on the fake's connection."""

    sql: str
    params: Any = None


@dataclass
class FakeCursor:
    """What ``RecordingConnection.execute`` returns: a write's cursor, with no rows to read.

    Reading it raises NeedsDatabase naming ``hook``: the fake runs no SQL, and
    ``None`` or ``[]`` would be a row PostgreSQL never returned.
    """

    rowcount: int = 0
    hook: str = "a settle hook"

    def _refuse(self) -> NeedsDatabase:
        return NeedsDatabase(
            f"{self.hook} reads what its statement returned; the in-memory store runs no "
            "SQL and has no rows to give: test this hook against PostgreSQL (brooq.Queue(dsn))"
        )

    def fetchone(self) -> Any:
        """Refused: NeedsDatabase."""
        raise self._refuse()

    def fetchall(self) -> list[Any]:
        """Refused: NeedsDatabase."""
        raise self._refuse()

    def fetchmany(self, size: int = 0) -> list[Any]:
        """Refused: NeedsDatabase."""
        raise self._refuse()

    def __iter__(self) -> Any:
        raise self._refuse()


@dataclass
class RecordingConnection:
    """What a settle hook receives from the in-memory store in place of a connection.

    ``execute(sql, params)`` records the statement (it runs nothing); what a
    settle's hooks recorded reaches ``store.executed`` only if the settle
    commits, so a failing hook leaves nothing behind, as a rolled-back
    transaction would.
    """

    executed: list[Executed] = field(default_factory=list)
    hook: str = "a settle hook"
    """The hook running now, named when it tries to read (see FakeCursor)."""

    def execute(self, sql: str, params: Any = None) -> FakeCursor:
        """Record ``sql`` with ``params``."""
        self.executed.append(Executed(sql, params))
        return FakeCursor(hook=self.hook)


class InMemoryStore:
    """A thread-safe in-memory implementation of the Store port."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self.rows: dict[str, JobRecord] = {}
        self.executed: list[Executed] = []
        """Statements that committed settle hooks ran on their RecordingConnection."""
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.RLock()

    def now(self) -> datetime:
        """The store's current time."""
        return self._clock()

    def enqueue_many(self, jobs: Sequence[Job], conn: Any = None) -> list[Enqueued]:
        """Insert jobs, deduplicating per (topic, idempotency_key).

        ``conn`` is refused: the fake has no transaction of yours to join, and
        silently committing would hide a rollback your code relies on.
        """
        if conn is not None:
            raise NeedsDatabase(
                "the in-memory store cannot enqueue inside your database transaction "
                "(conn=...); test that path against PostgreSQL (brooq.Queue(dsn)), or enqueue "
                "without conn= here"
            )
        with self._lock:
            return [self._enqueue_one(job) for job in jobs]

    async def enqueue_many_async(self, jobs: Sequence[Job], conn: Any) -> list[Enqueued]:
        """Refused: the in-memory store has no asyncio transaction to join."""
        raise NeedsDatabase(
            "the in-memory store cannot enqueue on an asyncio connection (enqueue_async); "
            "test that path against PostgreSQL (brooq.Queue(dsn))"
        )

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
            last_error=None,
            created_at=now,
            updated_at=now,
        )
        self.rows[row.id] = row
        return Enqueued(row.id, True)

    def claim(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limits: Mapping[str, int] | None = None,
    ) -> Claimed | None:
        """Take the ready row of ``topics`` first by (priority desc, available_at, id)."""
        claimed = self.claim_many(holder, topics, lease, 1, limits)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limit: int,
        limits: Mapping[str, int] | None = None,
    ) -> list[Claimed]:
        """Take up to ``limit`` ready rows of ``topics``, best first, within ``limits``."""
        with self._lock:
            now, limits = self.now(), limits or {}
            running = Counter(r.topic for r in self.rows.values() if r.state is State.PROCESSING)
            ready = sorted(
                (
                    r
                    for r in self.rows.values()
                    if r.state in CLAIMABLE_STATES and r.available_at <= now and r.topic in topics
                ),
                key=lambda r: (-r.priority, r.available_at, r.id),
            )
            out: list[Claimed] = []
            for row in ready:
                if len(out) >= limit:
                    break
                if row.topic in limits and running[row.topic] >= limits[row.topic]:
                    continue
                running[row.topic] += 1
                out.append(self._take(row, holder, lease, now))
            return out

    def _take(self, row: JobRecord, holder: str, lease: timedelta, now: datetime) -> Claimed:
        row = replace(
            row,
            state=State.PROCESSING,
            locked_by=holder,
            locked_until=now + lease,
            attempts=row.attempts + 1,
            updated_at=now,
        )
        self.rows[row.id] = row
        return Claimed(
            Ticket(row.id, holder, row.attempts),
            row.topic,
            json.dumps(row.payload, ensure_ascii=False),
            now + lease,
            row.expirations,
            row.priority,
            row.available_at,
        )

    def last_scheduled_run(self, schedule: Schedule) -> datetime | None:
        """The latest available_at among rows keyed by ``schedule``."""
        with self._lock:
            times = [
                r.available_at
                for r in self.rows.values()
                if r.topic == schedule.topic
                and r.idempotency_key
                and r.idempotency_key.startswith(schedule.key_prefix)
            ]
            return max(times, default=None)

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
            if outcome.kind is SettleKind.DONE:
                self._run_hooks(chain, hooks)
            self.rows[row.id] = self._settled(row, outcome, self.now())
            return True

    def _settled(self, row: JobRecord, outcome: Outcome, now: datetime) -> JobRecord:
        changes: dict[str, Any] = {"state": outcome.state, "updated_at": now, "expiry_streak": 0}
        if outcome.error is not None:
            changes["last_error"] = outcome.error
            changes["last_traceback"] = outcome.traceback
        if outcome.refund_attempt:
            changes["attempts"] = max(row.attempts - 1, row.expirations)
        if outcome.kind is SettleKind.FAILED:
            changes["available_at"] = now + (outcome.retry_in or timedelta(0))
        return replace(row, **changes)

    def settle_many(self, settles: Sequence[tuple[Ticket, Outcome]]) -> set[str]:
        """Write plain outcomes; the ids of the rows still held (and now written)."""
        with self._lock:
            written, now = set(), self.now()  # one statement: one now() for every row
            for ticket, outcome in settles:
                row = self._held(ticket)
                if row is not None and outcome.kind is not SettleKind.ABANDON:
                    self.rows[row.id] = self._settled(row, outcome, now)
                    written.add(row.id)
            return written

    def _run_hooks(self, chain: Sequence[Job], hooks: Sequence[SettleHook]) -> None:
        conn = RecordingConnection()
        saved = dict(self.rows)
        try:
            for job in chain:
                self._enqueue_one(job)
            for hook in hooks:
                conn.hook = f"settle hook {getattr(hook, '__qualname__', None) or repr(hook)}"
                hook(conn)
        except BaseException as exc:
            # Like the real transaction: any exception rolls back what the hooks wrote.
            self.rows = saved
            if isinstance(exc, NeedsDatabase) or not isinstance(exc, Exception):
                raise  # the test, not the job, is at fault: fail it loudly
            raise SettleHookFailed(f"{type(exc).__name__}: {exc}") from exc
        self.executed.extend(conn.executed)

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
            now = self.now()  # one statement in PostgreSQL: one now() for every row
            return {row.id for t in tickets if (row := self._held(t)) and self._give_back(row, now)}

    def release_unknown(self, holder: str, known: Sequence[str]) -> set[str]:
        """Give back every row ``holder`` holds that is not in ``known``."""
        with self._lock:
            keep, now = set(known), self.now()
            return {
                row.id
                for row in list(self.rows.values())
                if row.state is State.PROCESSING
                and row.locked_by == holder
                and row.id not in keep
                and self._give_back(row, now)
            }

    def _give_back(self, row: JobRecord, now: datetime) -> bool:
        self.rows[row.id] = replace(
            row,
            state=State.PENDING,
            attempts=max(row.attempts - 1, row.expirations),
            locked_by=None,
            locked_until=None,
            available_at=now,
            updated_at=now,
        )
        return True

    def requeue_expired(self, max_expirations: int = 0, batch: int = 1000) -> Requeued:
        """Return expired processing rows to pending, counting the expiry; dead at the max."""
        with self._lock:
            now = self.now()
            expired = sorted(
                (
                    r
                    for r in self.rows.values()
                    if r.state is State.PROCESSING
                    and r.locked_until is not None
                    and r.locked_until < now
                ),
                key=lambda r: r.locked_until or now,
            )
            pending: Counter[str] = Counter()
            dead: Counter[str] = Counter()
            for row in expired[:batch]:
                streak = row.expiry_streak + 1
                returned = replace(
                    row,
                    expirations=row.expirations + 1,
                    expiry_streak=streak,
                    locked_until=None,
                    available_at=now,
                    updated_at=now,
                )
                if max_expirations and streak >= max_expirations:
                    # Dead keeps its last holder, as PostgreSQL's statement does.
                    returned = replace(
                        returned, state=State.DEAD, last_error=expired_text(streak, row)
                    )
                    dead[row.topic] += 1
                else:
                    returned = replace(returned, state=State.PENDING, locked_by=None)
                    pending[row.topic] += 1
                self.rows[row.id] = returned
            return Requeued(_counts(pending), _counts(dead))

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[TopicCount]:
        """Delete up to ``batch`` terminal rows older than ``ttl``, oldest first."""
        if ttl <= timedelta(0):
            raise ValueError("retention TTL must be positive; 0 disables retention")
        with self._lock:
            cutoff = self.now() - ttl
            old = sorted(
                (
                    r
                    for r in self.rows.values()
                    if r.state in TERMINAL_STATES and r.updated_at < cutoff
                ),
                key=lambda r: r.updated_at,
            )[:batch]
            for row in old:
                del self.rows[row.id]
            return _counts(Counter(row.topic for row in old))

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a non-terminal job; False when it is already terminal."""
        with self._lock:
            row = self.get(job_id)
            if row.state in TERMINAL_STATES:
                return False
            if reason is not None:  # as PostgreSQL stores it: '' is a reason too
                reason = "canceled: " + clean_reason(reason)
            self.rows[row.id] = replace(
                row,
                state=State.CANCELED,
                updated_at=self.now(),
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


def expired_text(count: int, row: JobRecord) -> str:
    """last_error of a job the reaper moved to dead (the same text PostgreSQL writes)."""
    return (
        f"lease expired {count} times in a row: its holder died every time it ran "
        f"(last holder {row.locked_by}); the job may be killing its host"
    )


def _counts(counter: Counter[str]) -> list[TopicCount]:
    return [TopicCount(t, n) for t, n in sorted(counter.items())]
