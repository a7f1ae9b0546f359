"""Reaper and retention: small services with a ``run_once`` that returns what it did.

Each reschedules itself before working, so an error never loses the next
run; time is passed in (monotonic seconds), so tests need no sleeping.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from brooq.engine.port import Store, TopicCount

log = logging.getLogger("brooq.maintenance")

RETENTION_MAX_BATCHES = 100


def merge_counts(counts: list[TopicCount]) -> list[TopicCount]:
    """Sum counts per topic."""
    total: dict[str, int] = {}
    for topic, n in counts:
        total[topic] = total.get(topic, 0) + n
    return [TopicCount(t, n) for t, n in sorted(total.items())]


@dataclass
class Periodic:
    """A schedule: due every ``period`` seconds of the monotonic clock, first at once."""

    period: timedelta
    next_at: float = 0.0

    def due(self, now: float) -> bool:
        """True when a run is due; reschedules the next one first."""
        if now < self.next_at:
            return False
        self.next_at = now + self.period.total_seconds()
        return True


@dataclass
class Reaper:
    """Returns jobs whose lease expired to ``pending``; ``attempts`` untouched (invariant 7)."""

    store: Store
    schedule: Periodic

    def run_once(self) -> list[TopicCount]:
        """One pass; logs JobRequeued per topic."""
        counts = self.store.requeue_expired()
        for topic, n in counts:
            log.info("JobRequeued", extra={"event": "JobRequeued", "topic": topic, "count": n})
        return counts

    def tick(self, now: float) -> list[TopicCount]:
        """Run when due; otherwise do nothing."""
        return self.run_once() if self.schedule.due(now) else []


@dataclass
class Retention:
    """Deletes terminal rows older than ``ttl`` in batches; ttl 0 disables it entirely."""

    store: Store
    ttl: timedelta
    batch: int
    schedule: Periodic
    max_batches: int = RETENTION_MAX_BATCHES
    backlog: bool = field(default=False, init=False)

    @property
    def enabled(self) -> bool:
        """False when the TTL is zero: zero never means "delete everything"."""
        return self.ttl > timedelta(0)

    def run_once(self) -> list[TopicCount]:
        """Delete batches until one comes back short, at most ``max_batches``; warn on backlog."""
        if not self.enabled:
            return []
        deleted: list[TopicCount] = []
        for _ in range(self.max_batches):
            counts = self.store.delete_terminal(self.ttl, self.batch)
            deleted.extend(counts)
            if sum(n for _, n in counts) < self.batch:
                self.backlog = False
                break
        else:
            self.backlog = True
            log.warning("retention backlog: more terminal rows remain; the next tick goes on",
                        extra={"event": "RetentionBacklog", "batches": self.max_batches})
        merged = merge_counts(deleted)
        if merged:
            log.info("RetentionDeleted", extra={"event": "RetentionDeleted",
                                                "rows": sum(n for _, n in merged)})
        return merged

    def tick(self, now: float) -> list[TopicCount]:
        """Run when due; otherwise do nothing."""
        return self.run_once() if self.enabled and self.schedule.due(now) else []
