"""The in-memory store's upkeep: the reaper, retention, cancels and the schedules' reads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from brooq.engine.fake.graph import FakeGraph
from brooq.engine.outcome import clean_reason
from brooq.engine.store import DroppedPartition, Requeued, TopicCount
from brooq.vocabulary import TERMINAL_STATES, JobRecord, Schedule, State, parse_job_id


class FakeUpkeep(FakeGraph):
    """What the supervisor's maintenance and the operators do to the rows, as PostgreSQL does.

    Partitions are ranges of creation time (``created_at`` here, the id's time in
    PostgreSQL): the first one runs up to the next UTC midnight after the store
    was made; a row outside every range is in the default partition.
    """

    def __init__(
        self, clock: Callable[[], datetime] | None = None, app_version: str | None = None
    ) -> None:
        super().__init__(clock, app_version)
        first = self.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        self.partitions: list[tuple[str, datetime | None, datetime]] = [
            ("job_initial", None, first + timedelta(days=1))
        ]
        """(name, start, end) of each range partition, oldest first (start None: from the
        beginning)."""

    def add_partitions(self, step: timedelta, ahead: timedelta, most: int) -> list[str]:
        """Ranges of ``step`` from the end of the newest up to now + ``ahead`` (a range that
        lies behind now is widened to now's step), at most ``most``; their names."""
        if step < timedelta(hours=1):
            raise ValueError(f"partition step must be at least 1 hour, not {step}")
        with self._lock:
            now, made = self.now(), list[str]()
            start = max(end for _, _, end in self.partitions)
            while start < now + ahead and len(made) < most:
                end = start + step
                if end < now:
                    end = start + step * -((start - now) // step)
                name = "job_p" + start.astimezone(UTC).strftime("%Y%m%d_%H%M%S")
                self.partitions.append((name, start, end))
                made.append(name)
                start = end
            return made

    def drop_partitions(self, ttl: timedelta, most: int) -> list[DroppedPartition]:
        """Drop ranges that ended more than ``ttl`` ago whose rows are all terminal and
        settled more than ``ttl`` ago, with their rows (so their keys are free)."""
        if ttl <= timedelta(0):
            raise ValueError("retention TTL must be positive; 0 disables retention")
        with self._lock:
            cutoff, dropped = self.now() - ttl, list[DroppedPartition]()
            for name, start, end in list(self.partitions):
                if len(dropped) >= most or end > cutoff:
                    continue
                rows = [
                    r
                    for r in self.rows.values()
                    if (start is None or r.created_at >= start) and r.created_at < end
                ]
                if any(
                    r.state not in TERMINAL_STATES
                    or r.updated_at >= cutoff
                    or self._waited_for(r.id)
                    for r in rows
                ):
                    continue  # a live row, one settled within the TTL, or a parent its
                    # children may still read: the range waits
                for row in rows:
                    del self.rows[row.id]
                    self._forget_edges(row.id)
                self.partitions.remove((name, start, end))
                dropped.append(DroppedPartition(name, len(rows)))
            return dropped

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
            ended = [(r.id, "dead") for r in expired[:batch] if self.rows[r.id].state is State.DEAD]
            self._resolve(ended, now)
            if dead:
                self._ended_some()
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
                    if r.state in TERMINAL_STATES
                    and r.updated_at < cutoff
                    and not self._waited_for(r.id)
                ),
                key=lambda r: r.updated_at,
            )[:batch]
            for row in old:
                del self.rows[row.id]
                self._forget_edges(row.id)
            return _counts(Counter(row.topic for row in old))

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a non-terminal job; False when it is already terminal."""
        with self._lock:
            row = self.get(job_id)
            if row.state in TERMINAL_STATES:
                return False
            if reason is not None:  # as PostgreSQL stores it: '' is a reason too
                reason = "canceled: " + clean_reason(reason)
            now = self.now()
            self.rows[row.id] = replace(
                row,
                state=State.CANCELED,
                updated_at=now,
                last_error=reason if reason is not None else row.last_error,
            )
            self._resolve([(row.id, "canceled")], now)
            self._ended_some()
            return True

    def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> int:
        """Cancel every job of the workflow that has not ended; how many."""
        key = parse_job_id(workflow_id)
        with self._lock:
            if reason is not None:
                reason = "canceled: " + clean_reason(reason)
            now = self.now()
            live = [
                r
                for r in sorted(self.rows.values(), key=lambda r: r.id)
                if r.workflow_id == key and r.state not in TERMINAL_STATES
            ]
            for row in live:
                self.rows[row.id] = replace(
                    row,
                    state=State.CANCELED,
                    updated_at=now,
                    last_error=reason if reason is not None else row.last_error,
                )
            self._resolve([(r.id, "canceled") for r in live], now)
            if live:
                self._ended_some()
            return len(live)

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


def expired_text(count: int, row: JobRecord) -> str:
    """last_error of a job the reaper moved to dead (the same text PostgreSQL writes)."""
    return (
        f"lease expired {count} times in a row: its holder died every time it ran "
        f"(last holder {row.locked_by}); the job may be killing its host"
    )


def _counts(counter: Counter[str]) -> list[TopicCount]:
    return [TopicCount(t, n) for t, n in sorted(counter.items())]
