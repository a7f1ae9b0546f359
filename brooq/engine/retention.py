"""Retention: terminal rows older than the TTL are deleted in batches."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from brooq.engine.store import Store, TopicCount
from brooq.engine.timer import Every

log = logging.getLogger("brooq.retention")

RETENTION_MAX_BATCHES = 100


def merge_counts(counts: list[TopicCount]) -> list[TopicCount]:
    """Sum counts per topic."""
    total: dict[str, int] = {}
    for topic, n in counts:
        total[topic] = total.get(topic, 0) + n
    return [TopicCount(t, n) for t, n in sorted(total.items())]


@dataclass
class Retention:
    """Deletes terminal rows older than ``ttl`` in batches; ttl 0 disables it entirely."""

    store: Store
    ttl: timedelta
    batch: int
    every: Every
    max_batches: int = RETENTION_MAX_BATCHES
    backlog: bool = field(default=False, init=False)

    @property
    def enabled(self) -> bool:
        """False when the TTL is zero: zero never means "delete everything"."""
        return self.ttl > timedelta(0)

    def run_once(self) -> list[TopicCount]:
        """Delete batches until one comes back short, at most ``max_batches``; warn on backlog.

        A backlog makes the next tick due at once, so a caller that sets
        ``max_batches`` to 1 spreads a large deletion over its ticks.
        """
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
            if not self.backlog:  # once per backlog, not once per tick while it lasts
                log.warning(
                    "retention backlog: more terminal rows remain; the next ticks go on",
                    extra={"event": "RetentionBacklog", "batches": self.max_batches},
                )
            self.backlog = True
            self.every.hurry()
        merged = merge_counts(deleted)
        if merged:
            log.info(
                "RetentionDeleted",
                extra={"event": "RetentionDeleted", "rows": sum(n for _, n in merged)},
            )
        return merged

    def tick(self, now: float) -> list[TopicCount]:
        """Run when due; otherwise do nothing."""
        return self.run_once() if self.enabled and self.every.due(now) else []
