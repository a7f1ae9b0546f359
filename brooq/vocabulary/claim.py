"""What a handler receives: the claimed job, its lease, and the settle-transaction hooks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from brooq.vocabulary.job import Job
from brooq.vocabulary.parents import Parent

SettleHook = Callable[[Any], None]
"""A function called with the database connection of the settle transaction."""

ParentsReader = Callable[[], Mapping[str, Parent]]
"""What reads a claimed job's parents from its store (called once, on first use)."""


class Lease(NamedTuple):
    """Who holds a claimed job and until when (extended by heartbeats)."""

    holder: str
    until: datetime


@dataclass(slots=True)
class Claim:
    """A job taken by this worker for one attempt.

    ``attempt`` counts from 1 and is already charged: it is the charged attempt
    (times taken less ``expirations``, the times its holder died while it ran),
    which is what ``max_attempts`` bounds. ``deadline`` is when the
    attempt times out (None when the kind has no attempt timeout). Jobs added
    with :meth:`chain` and hooks added with :meth:`on_succeeded` run in the
    transaction that settles this job ``done``, and only then: if that
    transaction fails, they roll back with it. :attr:`parents` reads the
    jobs it was enqueued after. ``max_attempts`` and ``deadline`` follow the
    job's own overrides where it has them.
    """

    id: str
    topic: str
    payload: Any
    attempt: int
    lease: Lease
    deadline: datetime | None = None
    max_attempts: int | None = None
    expirations: int = 0
    trace_context: Mapping[str, str] | None = None
    """The trace context its enqueue stored (``Job.trace_context``), or None."""
    _chained: list[Job] = field(default_factory=list, repr=False)
    _hooks: list[SettleHook] = field(default_factory=list, repr=False)
    _read_parents: ParentsReader | None = field(default=None, repr=False)
    _parents: Mapping[str, Parent] | None = field(default=None, repr=False)

    @property
    def parents(self) -> Mapping[str, Parent]:
        """The jobs this one waited for (``Job(after=…)``, a workflow's edges): id →
        ``Parent(state, result)``, in id order; empty for a job without parents.

        Read from the store on first use (a job that never asks pays nothing), then kept.
        A parent whose row is gone has state None. Under ``if_parent_fails="run"`` this is
        how a child sees which parents failed.
        """
        if self._parents is None:
            self._parents = dict(self._read_parents()) if self._read_parents else {}
        return self._parents

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure of this attempt makes the job ``dead``."""
        return self.max_attempts is not None and self.attempt >= self.max_attempts

    def chain(self, job: Job) -> None:
        """Enqueue ``job`` in the settle transaction, only if this attempt succeeds."""
        if not isinstance(job, Job):
            raise TypeError(f"chain() takes a brooq.Job, not {type(job).__name__}")
        self._chained.append(job)

    def on_succeeded(self, fn: SettleHook) -> None:
        """Call ``fn(conn)`` in the settle transaction, only if this attempt succeeds.

        ``conn`` is the psycopg connection of that transaction: what ``fn``
        writes commits atomically with the job's ``done``.
        """
        if not callable(fn):
            raise TypeError("on_succeeded() takes a callable fn(conn)")
        self._hooks.append(fn)

    @property
    def chained(self) -> tuple[Job, ...]:
        """Jobs to enqueue on success, in the order given."""
        return tuple(self._chained)

    @property
    def hooks(self) -> tuple[SettleHook, ...]:
        """Hooks to call on success, in the order given."""
        return tuple(self._hooks)
