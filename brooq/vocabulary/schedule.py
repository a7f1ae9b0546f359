"""Periodic jobs: a cron schedule that enqueues a job for each run."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from brooq.vocabulary.errors import InvalidJob
from brooq.vocabulary.job import Job
from brooq.vocabulary.payload import encode_payload
from brooq.vocabulary.topic import Topic

MissedRuns = Literal["latest", "all", "skip"]
MISSED_RUNS = ("latest", "all", "skip")


@dataclass(frozen=True, slots=True)
class Schedule:
    """Enqueue ``topic``/``payload`` at every time ``cron`` (5 fields) matches in ``tz``.

    Each run's job carries the idempotency key ``periodic:<name>:<run time>``,
    so any number of supervisors enqueue it exactly once. ``missed`` says what
    happens to runs that fell due while no supervisor ran: ``latest`` (the
    default) enqueues only the most recent one, ``all`` every one (at most
    100), ``skip`` none.
    """

    cron: str
    topic: str
    payload: Any = None
    name: str = ""
    tz: str = "UTC"
    missed: MissedRuns = "latest"
    priority: int = 0
    _topic: Topic = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_topic", Topic(self.topic))
        for attr in ("cron", "tz", "name"):
            value = getattr(self, attr)
            if not isinstance(value, str):
                raise InvalidJob(f"{attr} must be a string, not {type(value).__name__}")
        if not self.name:
            object.__setattr__(self, "name", f"{self.topic}@{self.cron}")
        if self.missed not in MISSED_RUNS:
            raise InvalidJob(f"missed must be one of {', '.join(MISSED_RUNS)}, not {self.missed!r}")
        # Whatever makes a run's job invalid (priority, payload, a name too long for
        # the key) fails here, at registration, not in the supervisor at every run.
        try:
            encode_payload(self.payload)
            self.job_for(datetime(2000, 1, 1, tzinfo=UTC))
        except InvalidJob as exc:
            raise InvalidJob(f"schedule {self.name!r}: {exc}") from None

    @property
    def key_prefix(self) -> str:
        """The start of every idempotency key of this schedule's jobs."""
        return f"periodic:{self.name}:"

    def job_for(self, run: datetime) -> Job:
        """The job of the run at ``run`` (timezone-aware), keyed for exactly-once enqueue."""
        return Job(
            topic=self.topic,
            payload=self.payload,
            available_at=run,
            priority=self.priority,
            idempotency_key=f"{self.key_prefix}{run.isoformat()}",
        )
