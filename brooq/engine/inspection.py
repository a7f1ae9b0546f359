"""The Inspection port: read-only views of the queue for operators (status, metrics, dashboard).

Kept apart from the Store port: the engine never needs them to run jobs, and
an adapter may serve them from another connection, under a time limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from brooq.engine.filters import Cursor, JobFilter
from brooq.vocabulary import JobRecord, State, TopicPause


@dataclass(frozen=True, slots=True)
class VersionCount:
    """How many jobs of a topic not started yet (waiting, pending, failed) carry an app
    version (None: unversioned); only supervisors of that version (or any, for None) run
    them."""

    topic: str
    app_version: str | None
    jobs: int


@dataclass(frozen=True, slots=True)
class TopicStateCount:
    """How many rows of a topic are in a state."""

    topic: str
    state: str
    jobs: int


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job in flight: who holds it and how much of its lease is left."""

    id: str
    topic: str
    locked_by: str | None
    attempts: int
    expirations: int
    lease_left_s: float | None


@dataclass(frozen=True, slots=True)
class DeadJob:
    """A job that went dead, with its last error."""

    id: str
    topic: str
    attempts: int
    expirations: int
    last_error: str | None
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class TopicRate:
    """A topic's rate limit as its claims last recorded it, and what its buckets hold now."""

    topic: str
    limit: str
    """``"20/s"``: starts per second, minute or hour."""
    burst: int
    tokens: float
    """Tokens the topic's own bucket holds (its jobs without a rate_key), fractions included."""
    keys: int
    """Keys (rate_key) whose bucket is in use: not full again yet."""
    keys_waiting: int
    """Keys whose bucket holds no whole token: their next job waits for the limit."""


@dataclass(frozen=True, slots=True)
class JobRow:
    """One line of a job listing (last_error cut to a few hundred characters)."""

    id: str
    topic: str
    state: str
    attempts: int
    expirations: int
    priority: int
    available_at: datetime
    updated_at: datetime
    last_error: str | None


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of a listing, newest first, and the cursor of the next one (None: the last)."""

    rows: list[JobRow]
    next: Cursor | None


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """One worker process of a supervisor as its supervisor last reported it."""

    pid: int
    slot: int
    job_id: str | None = None
    topic: str | None = None
    started_at: datetime | None = None
    """When the current job's attempt started (None: idle)."""


@dataclass(frozen=True, slots=True)
class SupervisorRow:
    """A supervisor registered against this database, and its workers."""

    holder: str
    host: str
    pid: int
    app: str
    topics: tuple[str, ...]
    started_at: datetime
    seen_at: datetime
    workers: tuple[WorkerSnapshot, ...]
    alive: bool
    """``seen_at`` within the window of the database's clock, before or after it: a row
    past it belongs to a supervisor that died, and a row dated far ahead never counts."""
    app_version: str | None = None
    """The app version it claims (its own jobs' and unversioned ones); None: unversioned."""


@dataclass(frozen=True, slots=True)
class SkippedRow:
    """A row of ``brooq_supervisor`` a view cannot read (written by hand, say): whose, and why."""

    holder: str
    problem: str


@dataclass(frozen=True, slots=True)
class SupervisorRows:
    """The rows of ``brooq_supervisor``: those that could be read, and those skipped."""

    rows: list[SupervisorRow]
    skipped: list[SkippedRow]


@dataclass(frozen=True, slots=True)
class MinuteCount:
    """Jobs that reached ``done`` and ``dead`` in one minute."""

    minute: datetime
    done: int
    dead: int


@dataclass(frozen=True, slots=True)
class Relative:
    """A parent or a child of a job, and its state (None: the row is gone)."""

    id: str
    state: State | None


@dataclass(frozen=True, slots=True)
class Family:
    """A job's parents and children (the first of each, by id) and how many there are."""

    parents: list[Relative]
    children: list[Relative]
    parents_total: int = 0
    children_total: int = 0


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One partition of the job table: its range of creation times, its rows, its size."""

    name: str
    starts: datetime | None
    """Where its range of ids starts, as a time (None: from the very first)."""
    ends: datetime | None
    """Where it ends (None for the default partition, which holds ids outside every range)."""
    default: bool
    rows: int
    """The statistics' count of live rows: an estimate, never a scan."""
    bytes: int
    """Its size on disk, indexes included."""


class Inspection(Protocol):
    """What operators read about the queue. Every call is one bounded query."""

    def depth(self) -> list[TopicStateCount]:
        """Rows per topic and state."""
        ...

    def oldest_ready(self) -> dict[str, float]:
        """Seconds the oldest ready job of each topic has waited; topics with none absent."""
        ...

    def running(self) -> list[RunningJob]:
        """Jobs in flight, soonest lease end first."""
        ...

    def recent_dead(self, since: timedelta, limit: int = 20) -> list[DeadJob]:
        """Jobs that went dead within ``since``, newest first, at most ``limit``."""
        ...

    def count_dead(self, since: timedelta) -> int:
        """How many jobs went dead within ``since`` (a total, never capped)."""
        ...

    def rate_limits(self) -> list[TopicRate]:
        """Every rate-limited topic a claim or a supervisor recorded, by topic."""
        ...

    def pauses(self) -> list[TopicPause]:
        """Every paused topic (reason, since when, by whom), by name."""
        ...

    def pending_by_version(self) -> list[VersionCount]:
        """Jobs not started yet per topic and app version (unversioned first)."""
        ...

    def job(self, job_id: str) -> JobRecord:
        """One job's whole row; JobNotFound when there is none."""
        ...

    def family(self, job_id: str) -> Family:
        """The jobs ``job_id`` waits for (or waited for) and the jobs that wait for it."""
        ...

    def list_jobs(self, where: JobFilter) -> JobPage:
        """One page of the jobs ``where`` matches, newest ``updated_at`` first."""
        ...

    def count_jobs(self, where: JobFilter) -> int:
        """How many jobs ``where`` matches (cursor and limit ignored)."""
        ...

    def supervisors(self) -> list[SupervisorRow]:
        """Every registered supervisor whose row can be read, live ones first (rows of dead
        ones until they expire)."""
        ...

    def supervisor_rows(self) -> SupervisorRows:
        """The rows :meth:`supervisors` returns, and those it skips, each named with why."""
        ...

    def throughput(self, since: timedelta) -> list[MinuteCount]:
        """Jobs done and dead per minute within ``since``, oldest minute first, gaps as 0."""
        ...

    def partitions(self) -> list[PartitionRow]:
        """Every partition of the job table, oldest range first, the default one last."""
        ...

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers."""
        ...
