"""The Inspection port: read-only views of the queue for operators (status, metrics, dashboard).

Kept apart from the Store port: the engine never needs them to run jobs, and
an adapter may serve them from another connection, under a time limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol


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

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers."""
        ...
