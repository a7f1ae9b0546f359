"""The Store port: everything the engine needs from a database, shaped by the domain.

The PostgreSQL adapter implements it with guarded SQL; the in-memory fake
implements it for unit tests. One contract suite runs against both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from brooq.engine.outcome import Outcome
from brooq.engine.pauses import Pauses
from brooq.vocabulary import (
    Enqueued,
    Fairness,
    Job,
    JobRecord,
    KindOptions,
    Parent,
    RateLimit,
    Schedule,
    SettleHook,
    Workflow,
    decode_stored_payload,
)


class SettleHookFailed(Exception):
    """A chain or on_succeeded hook raised inside the settle transaction, which rolled back."""


class PayloadUndecodable(Exception):
    """A claimed job's payload is JSON that Python cannot decode (too deep, too long a number)."""


class Ticket(NamedTuple):
    """The fencing token of one attempt: every write about it is guarded by all three.

    ``attempt`` is the row's ``attempts`` after the claim (times taken, lease
    expiries included), not the charged attempt number a handler sees.
    """

    job_id: str
    holder: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job the store just handed to ``ticket.holder``.

    ``payload_text`` is the JSON as stored; :attr:`payload` decodes it where
    the handler runs (a payload Python cannot decode is that job's problem,
    never the claimer's).
    """

    ticket: Ticket
    topic: str
    payload_text: str
    locked_until: datetime
    expirations: int = 0
    priority: int = 0
    available_at: datetime | None = None
    overrides: KindOptions | None = None
    """The kind options the job sets for itself (``Job(max_attempts=…)``), or None."""
    trace_context: str | None = None
    """The trace context its enqueue stored, as JSON text (decoded where it runs), or None."""

    @property
    def id(self) -> str:
        """The job's id."""
        return self.ticket.job_id

    @property
    def attempt(self) -> int:
        """The charged attempt number, from 1: times taken less lease expiries."""
        return self.ticket.attempt - self.expirations

    @property
    def payload(self) -> Any:
        """The decoded payload; PayloadUndecodable when Python cannot decode it."""
        payload, error = decode_stored_payload(self.payload_text)
        if error is not None:
            raise PayloadUndecodable(error)
        return payload


class ClaimedBatch(list[Claimed]):
    """What ``claim_many`` returns: the jobs claimed, best first, and what the rate limits did.

    ``rate_limited`` maps each topic whose claim the rate limit cut short (a
    key, or the topic, had ready jobs and no token left) to the seconds until
    one of those keys has a token again.
    """

    def __init__(
        self, claimed: Iterable[Claimed] = (), rate_limited: Mapping[str, float] | None = None
    ) -> None:
        super().__init__(claimed)
        self.rate_limited: dict[str, float] = dict(rate_limited or {})

    def next_token_in(self) -> float | None:
        """Seconds until the first cut-short topic gets a token again (None: none was)."""
        return min(self.rate_limited.values(), default=None)


class TopicCount(NamedTuple):
    """How many rows of a topic a maintenance pass touched."""

    topic: str
    rows: int


@dataclass(frozen=True, slots=True)
class Requeued:
    """What one reaper pass did: rows back to pending, rows dead after too many expiries."""

    pending: list[TopicCount]
    dead: list[TopicCount]

    @property
    def total(self) -> int:
        """Rows the pass touched."""
        return sum(n for _, n in self.pending) + sum(n for _, n in self.dead)


@dataclass(frozen=True, slots=True)
class DroppedPartition:
    """A partition retention dropped whole: its name and the rows it held (an estimate)."""

    name: str
    rows: int


class Store(Pauses, Protocol):
    """Persistence of jobs. Every write about an attempt is fenced by its Ticket."""

    def enqueue_many(self, jobs: Sequence[Job], conn: Any = None) -> list[Enqueued]:
        """Insert jobs (idempotent per topic and key); in ``conn``'s transaction if given.

        A job with parents (``Job(after=…)``) is written ``waiting`` while one of them has
        not ended, ``pending`` when all have, or ``canceled`` by its policy when one ended
        dead or canceled or does not exist (brooq.engine.edges). A store that cannot write
        in a caller's transaction (the in-memory one) raises NeedsDatabase for a ``conn``
        rather than ignoring it.
        """
        ...

    def enqueue_workflow(self, workflow: Workflow, conn: Any = None) -> list[Enqueued]:
        """Write every job of ``workflow`` and its edges at once (one statement, in ``conn``'s
        transaction if given), each job carrying the workflow's id; one Enqueued per job, in
        the order they were added. InvalidJob for a cycle, or a workflow enqueued before."""
        ...

    def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> int:
        """Cancel every job of the workflow that has not ended (running ones too), in one
        statement; how many. Their children's edges are resolved by their policies."""
        ...

    def parents(self, job_id: str) -> dict[str, Parent]:
        """What job ``job_id`` sees of its parents: id → Parent(state, result), by id."""
        ...

    def resolve_stranded(self, batch: int = 1000) -> int:
        """Resolve, by their children's policies, open edges whose parent has ended, or is
        gone while every child waiting for it is older than MISSING_PARENT_GRACE (the
        reaper's safety net; see queries.sql ``resolve_stranded``); how many."""
        ...

    async def enqueue_many_async(self, jobs: Sequence[Job], conn: Any) -> list[Enqueued]:
        """Insert jobs in ``conn``'s (a psycopg AsyncConnection) open transaction.

        A store without such transactions (the in-memory one) raises NeedsDatabase.
        """
        ...

    def claim(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limits: Mapping[str, int] | None = None,
        rates: Mapping[str, RateLimit] | None = None,
        fair: Mapping[str, Fairness] | None = None,
    ) -> Claimed | None:
        """Take the next ready job of ``topics`` for ``holder`` (claim_many of one)."""
        ...

    def claim_many(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limit: int,
        limits: Mapping[str, int] | None = None,
        rates: Mapping[str, RateLimit] | None = None,
        fair: Mapping[str, Fairness] | None = None,
    ) -> ClaimedBatch:
        """Take up to ``limit`` ready jobs of ``topics`` for ``holder``, charging one attempt each.

        Highest priority first, then ``available_at``, then enqueue order; the
        result is in that order. A topic in ``limits`` is claimed only while
        fewer than its limit of its jobs are processing (everywhere, not just
        here), and never beyond it. A topic in ``rates`` is claimed only with
        a token of its bucket (one per job's ``rate_key``, the topic's own for
        jobs without one), on the store's clock: over any window of ``w``
        seconds, the claims of one bucket never exceed ``burst + rate * w``.
        Keys with tokens are served in claim order; keys without wait. A topic in
        ``fair`` takes its keys (``rate_key``; jobs without one share one key) in turn
        within each priority: a key's n-th oldest ready job of a priority goes before any
        key's (n+1)-th, ``weight`` of them per turn for a weighted key (n / weight orders
        them, then available_at and id); exact across hosts like ``limits``.
        """
        ...

    def declare_rates(self, rates: Mapping[str, RateLimit]) -> None:
        """Record each topic's rate limit in its bucket (created full when missing), so that
        operators read it before the first claim; the tokens are left as they are."""
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

    def settle_many(self, settles: Sequence[tuple[Ticket, Outcome]]) -> set[str]:
        """Write plain outcomes (no chain or hooks) in one statement; the ids written.

        Like :meth:`settle`, :meth:`cancel` and the reaper's dead, it resolves the edges
        of the jobs it ends in the same statement: a waiting child whose last parent ended
        becomes pending (or canceled by its policy), exactly once.

        An id missing from the result was no longer held (lease lost): a
        normal result, never an error.
        """
        ...

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        """Extend the leases still held (to the database's now + ``lease``); the ids extended."""
        ...

    def release(self, tickets: Sequence[Ticket]) -> set[str]:
        """Return held jobs to ``pending`` giving back their attempt (shutdown, not failure).

        Each released job gives its rate limit's token back to its bucket
        (one that is full stays full).
        """
        ...

    def release_unknown(self, holder: str, known: Sequence[str]) -> set[str]:
        """Give back, uncharged, every row ``holder`` holds whose id is not in ``known``
        (tokens included, as :meth:`release`)."""
        ...

    def requeue_expired(self, max_expirations: int = 0, batch: int = 1000) -> Requeued:
        """Return at most ``batch`` rows whose lease expired to ``pending``.

        ``attempts`` is untouched and ``expirations`` counted; a row reaching
        ``max_expirations`` (0: never) goes ``dead`` instead.
        """
        ...

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[TopicCount]:
        """Delete at most ``batch`` terminal rows last updated more than ``ttl`` ago."""
        ...

    def add_partitions(self, step: timedelta, ahead: timedelta, most: int) -> list[str]:
        """Create the partitions that cover up to now + ``ahead``, ``step`` long, at most
        ``most``; their names. Nothing when another host is at it or a lock is busy (the
        next call goes on)."""
        ...

    def drop_partitions(self, ttl: timedelta, most: int) -> list[DroppedPartition]:
        """Drop at most ``most`` partitions whose range ended more than ``ttl`` ago and whose
        rows are all terminal and settled more than ``ttl`` ago, each with its rows'
        idempotency keys in one transaction. A partition holding a live row stays; a busy
        lock leaves it for the next call."""
        ...

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a pending, failed or processing job; False if it is already terminal.

        Raises JobNotFound for an unknown id.
        """
        ...

    def get(self, job_id: str) -> JobRecord:
        """The job's row. Raises JobNotFound for an unknown id."""
        ...

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """What a ``done`` job's handler returned, waiting up to ``timeout`` seconds for it to
        end (None: no limit). JobDead/JobCanceled for one that ended without success,
        ResultTimeout while it has not ended, JobNotFound for an unknown id."""
        ...

    async def result_async(self, job_id: str, timeout: float | None = None) -> Any:
        """:meth:`result`, awaited (the event loop is never blocked)."""
        ...

    def last_scheduled_run(self, schedule: Schedule) -> datetime | None:
        """The due time of the latest run of ``schedule`` still in the table."""
        ...
