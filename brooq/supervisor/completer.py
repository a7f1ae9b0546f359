"""The completer: the plain outcomes reported by workers, written together.

One guarded statement (``UPDATE … FROM`` a JSON array of outcomes) per
flush, every few milliseconds or at a size bound. A row that no longer
matches its fence (state, holder, attempt) lost its lease: counted and
logged, never an error. A flush that fails is put back and tried again on a
later tick; a supervisor that dies with outcomes unwritten loses nothing but
time (the leases expire, the jobs run again: at least once).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from brooq.engine.outcome import Outcome
from brooq.engine.store import Store, Ticket
from brooq.logs import event
from brooq.supervisor.database import Database

log = logging.getLogger("brooq.supervisor")

FLUSH_EVERY_S = 0.02
"""A lone outcome waits at most this long for company before it is written: a statement
costs the supervisor and the database about as much for one row as for a hundred."""
FLUSH_AT = 100
"""A flush goes out at once when this many outcomes wait."""
MAX_BATCH = 5000
"""At most this many rows per statement."""
MAX_PENDING = 10_000
"""Above this many waiting outcomes, no new job goes out to a worker (backpressure)."""
RETRY_AFTER_S = 0.5


@dataclass(frozen=True, slots=True)
class Pending:
    """An outcome to write, and what it is about."""

    ticket: Ticket
    outcome: Outcome
    topic: str
    since: float


Written = Callable[[list[Pending], list[Pending]], None]
"""Called in the loop after a flush: the outcomes written, those whose lease was lost."""


class Completer:
    """Batches plain outcomes and writes each batch with one statement."""

    def __init__(self, store: Store, db: Database, on_flushed: Written) -> None:
        self.store, self.db = store, db
        self.on_flushed = on_flushed
        self.pending: list[Pending] = []
        self.not_before = 0.0
        self.failures = 0
        self.in_flight: float | None = None
        """When the oldest outcome of the flush under way was reported (None: no flush)."""

    def add(self, ticket: Ticket, outcome: Outcome, topic: str, now: float) -> None:
        """Queue an outcome for the next flush."""
        self.pending.append(Pending(ticket, outcome, topic, now))

    @property
    def full(self) -> bool:
        """True when the database falls behind: hold new jobs back until it catches up."""
        return len(self.pending) >= MAX_PENDING

    def next_flush_at(self) -> float | None:
        """When the waiting outcomes are due to be written (monotonic), or None."""
        if not self.pending or self.db.busy("flush"):
            return None
        return max(self.not_before, self.pending[0].since + FLUSH_EVERY_S)

    def run_once(self, now: float, *, force: bool = False) -> int:
        """Flush when due (or ``force``); how many outcomes were sent."""
        if not self.pending or self.db.busy("flush") or now < self.not_before:
            return 0
        due = force or len(self.pending) >= FLUSH_AT or now - self.pending[0].since >= FLUSH_EVERY_S
        if not due:
            return 0
        batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
        settles = [(p.ticket, p.outcome) for p in batch]
        self.in_flight = min(p.since for p in batch)

        def done(written: set[str] | None, error: BaseException | None) -> None:
            self.in_flight = None
            if error is not None or written is None:
                self.failures += 1
                self.pending[:0] = batch  # first in line again, never dropped
                self.not_before = now + min(RETRY_AFTER_S * self.failures, 5.0)
                event(
                    log,
                    "FlushFailed",
                    logging.WARNING,
                    outcomes=len(batch),
                    error=str(error),
                    retry_in_s=round(self.not_before - now, 3),
                )
                return
            self.failures, self.not_before = 0, 0.0
            ok = [p for p in batch if p.ticket.job_id in written]
            lost = [p for p in batch if p.ticket.job_id not in written]
            self.on_flushed(ok, lost)

        self.db.submit("flush", lambda: self.store.settle_many(settles), done)
        return len(batch)

    def oldest(self) -> float | None:
        """When the oldest outcome not written yet was reported (monotonic), or None: how
        long outcomes wait says whether they can be written at all (/healthz)."""
        times = [p.since for p in self.pending[:1]]
        if self.in_flight is not None:
            times.append(self.in_flight)
        return min(times, default=None)

    def forget(self, job_id: str) -> None:
        """Drop the waiting outcome of a job (its lease ended long ago: nothing to write)."""
        self.pending = [p for p in self.pending if p.ticket.job_id != job_id]


def count_by_label(items: list[Pending]) -> Counter[tuple[str, str]]:
    """How many outcomes per (topic, label): one metric update each, not one per job."""
    return Counter((p.topic, p.outcome.label) for p in items)
