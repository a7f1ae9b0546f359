"""Which jobs an operator means: one frozen filter shared by the CLI and the dashboard.

A filter names topics (any of them), one state, a window of ``updated_at``
(since inclusive, until exclusive), explicit ids, a workflow, a page size and a
keyset cursor. Paging is by ``(updated_at, id)``, newest first, never by OFFSET: a
page costs the same however deep it is, and rows added meanwhile do not
shift the pages already read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from brooq.vocabulary import InvalidInput, State, Topic, parse_duration, parse_job_id

MAX_PAGE = 1000
DEFAULT_PAGE = 50


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page ends: the ``(updated_at, id)`` of its last row."""

    updated_at: datetime
    id: str

    def encode(self) -> str:
        """The cursor as one opaque token (``--after`` and the dashboard's links)."""
        return f"{self.updated_at.isoformat()}~{self.id}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor of :meth:`encode`; InvalidInput when ``text`` is not one."""
        at, sep, job_id = text.strip().partition("~")
        try:
            when = datetime.fromisoformat(at)
            if not sep or when.tzinfo is None:
                raise ValueError(text)
            return cls(when, parse_job_id(job_id))
        except (ValueError, InvalidInput):
            raise InvalidInput(
                f"{text!r} is not a page cursor; pass the one a listing "
                "printed (next page: --after …)"
            ) from None


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The jobs an operator means. Empty fields match everything."""

    topics: tuple[str, ...] = ()
    state: State | None = None
    since: datetime | None = None
    """Only rows updated at or after this time."""
    until: datetime | None = None
    """Only rows updated before this time."""
    ids: tuple[str, ...] = ()
    workflow: str | None = None
    """Only the jobs of this workflow (its id)."""
    limit: int = DEFAULT_PAGE
    """Rows per page (listings) or at most this many rows changed (bulk actions; 0: all)."""
    after: Cursor | None = field(default=None)
    """Listings: the page after this cursor."""

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise InvalidInput(f"--limit {self.limit}: give a positive number")
        if self.since and self.until and self.since >= self.until:
            raise InvalidInput("--since must be before --until")

    def params(self) -> dict[str, object]:
        """The filter's SQL parameters (the ``job_filter`` fragment of queries.sql)."""
        return {
            "topics": list(self.topics),
            "state": str(self.state) if self.state else None,
            "since": self.since,
            "until": self.until,
            "ids": list(self.ids),
            "workflow": self.workflow,
        }

    @property
    def page_size(self) -> int:
        """Rows of one listing page: ``limit``, at most MAX_PAGE (0 means the default)."""
        return min(self.limit or DEFAULT_PAGE, MAX_PAGE)


def parse_state(
    text: str,
    allowed: tuple[State, ...] = tuple(State),
    what: str = "state",
) -> State:
    """A state name among ``allowed``; InvalidInput naming the choices otherwise."""
    try:
        state = State(text.strip().lower())
    except ValueError:
        state = None
    if state is None or state not in allowed:
        choices = ", ".join(str(s) for s in allowed)
        raise InvalidInput(f"{what} {text!r}: choose one of {choices}")
    return state


def parse_when(text: str, what: str, now: datetime | None = None) -> datetime:
    """``--since``/``--until``: a duration meaning that long ago, or an ISO 8601 time, zoned."""
    now = now or datetime.now(UTC)
    try:
        return now - parse_duration(text)
    except (ValueError, OverflowError):
        pass
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"{what} {text!r} is neither a duration (30m, 2h, 7d) nor an ISO 8601 "
            "time (2026-12-24T18:00:00+00:00)"
        ) from None
    if when.tzinfo is None:
        raise InvalidInput(f"{what} {text!r} has no time zone; add one, e.g. {text}Z")
    return when


def filter_of(
    *,
    topics: Sequence[str] = (),
    state: str | None = None,
    since: str | None = None,
    until: str | None = None,
    limit: int | None = None,
    after: str | None = None,
    ids: Sequence[str] = (),
    workflow: str | None = None,
    states: Sequence[State] = tuple(State),
    default_limit: int = 0,
    flag: str = "--",
) -> JobFilter:
    """The JobFilter of text values (flags, query strings); InvalidInput for any bad one.

    ``states`` are the states this caller may name; ``flag`` prefixes names in messages.
    """
    try:
        job_ids = tuple(parse_job_id(i) for i in ids)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    try:
        workflow_id = parse_job_id(workflow) if workflow else None
    except ValueError:
        raise InvalidInput(
            f"{flag}workflow {workflow!r} is not a workflow id (a UUID: workflow.id)"
        ) from None
    return JobFilter(
        topics=tuple(str(Topic(t.strip())) for t in topics if t.strip()),
        state=parse_state(state, tuple(states), f"{flag}state") if state else None,
        since=parse_when(since, f"{flag}since") if since else None,
        until=parse_when(until, f"{flag}until") if until else None,
        ids=job_ids,
        workflow=workflow_id,
        limit=default_limit if limit is None else limit,
        after=Cursor.decode(after) if after else None,
    )
