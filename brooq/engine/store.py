"""The Store port: everything the engine needs from a database, shaped by the domain.

The PostgreSQL adapter implements it with guarded SQL; the in-memory fake
implements it for unit tests. One contract suite runs against both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from brooq.engine.outcome import Outcome
from brooq.vocabulary import Enqueued, Job, JobRecord, Schedule, SettleHook


class SettleHookFailed(Exception):
    """A chain or on_succeeded hook raised inside the settle transaction, which rolled back."""


class Ticket(NamedTuple):
    """The fencing token of one attempt: every write about it is guarded by all three."""

    job_id: str
    holder: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job the store just handed to ``ticket.holder``."""

    ticket: Ticket
    topic: str
    payload: Any
    locked_until: datetime

    @property
    def id(self) -> str:
        """The job's id."""
        return self.ticket.job_id

    @property
    def attempt(self) -> int:
        """The attempt number, from 1, already charged."""
        return self.ticket.attempt


class TopicCount(NamedTuple):
    """How many rows of a topic a maintenance pass touched."""

    topic: str
    rows: int


class Store(Protocol):
    """Persistence of jobs. Every write about an attempt is fenced by its Ticket."""

    def enqueue_many(self, jobs: Sequence[Job], conn: Any = None) -> list[Enqueued]:
        """Insert jobs (idempotent per topic and key); in ``conn``'s transaction if given."""
        ...

    def claim(
        self, holder: str, topics: Sequence[str], lease: timedelta,
        limits: Mapping[str, int] | None = None,
    ) -> Claimed | None:
        """Take the next ready job of ``topics`` for ``holder``, charging one attempt.

        Highest priority first, then ``available_at``, then enqueue order. A
        topic in ``limits`` is claimed only while fewer than its limit of its
        jobs are processing (everywhere, not just here).
        """
        ...

    def settle_and_claim(
        self, ticket: Ticket, outcome: Outcome, topics: Sequence[str], lease: timedelta,
    ) -> tuple[bool, Claimed | None]:
        """settle (no chain/hooks) and claim (no limits) in one transaction."""
        ...

    def settle(
        self,
        ticket: Ticket,
        outcome: Outcome,
        chain: Sequence[Job] = (),
        hooks: Sequence[SettleHook] = (),
    ) -> bool:
        """Write ``outcome`` if ``ticket`` still holds the job; False when the lease is lost.

        ``chain`` and ``hooks`` run in the same transaction, only for DONE.
        """
        ...

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        """Extend the leases still held; return the ids whose lease was extended."""
        ...

    def release(self, tickets: Sequence[Ticket]) -> set[str]:
        """Return held jobs to ``pending`` giving back their attempt (shutdown, not failure)."""
        ...

    def requeue_expired(self) -> list[TopicCount]:
        """Return rows whose lease expired to ``pending`` without touching ``attempts``."""
        ...

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[TopicCount]:
        """Delete at most ``batch`` terminal rows last updated more than ``ttl`` ago."""
        ...

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a pending, failed or processing job; False if it is already terminal.

        Raises JobNotFound for an unknown id.
        """
        ...

    def get(self, job_id: str) -> JobRecord:
        """The job's row. Raises JobNotFound for an unknown id."""
        ...

    def last_scheduled_run(self, schedule: Schedule) -> datetime | None:
        """The due time of the latest run of ``schedule`` still in the table."""
        ...
