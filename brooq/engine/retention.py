"""Retention: old partitions are dropped whole; terminal rows left behind, in batches.

A partition (a range of creation times) goes once its range ended more than
the TTL ago and every row in it is terminal and settled more than the TTL
ago: no DELETE, no dead tuples, no vacuum. A partition that holds a live row
(a job scheduled months ahead, a failed one waiting for its retry) waits; its
terminal rows, and those of the default partition, are deleted in batches once
they are older than the TTL and one partition interval (by then a partition
that could go has gone, so the batches take only what no drop will).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from brooq.engine.partitions import DEFAULT_PARTITION_INTERVAL
from brooq.engine.store import DroppedPartition, Store, TopicCount
from brooq.engine.timer import Every

log = logging.getLogger("brooq.retention")

RETENTION_MAX_BATCHES = 100
RETENTION_MAX_DROPS = 4
"""Partitions dropped a pass at most (each drop locks the table for milliseconds)."""


def merge_counts(counts: list[TopicCount]) -> list[TopicCount]:
    """Sum counts per topic."""
    total: dict[str, int] = {}
    for topic, n in counts:
        total[topic] = total.get(topic, 0) + n
    return [TopicCount(t, n) for t, n in sorted(total.items())]


@dataclass
class Retention:
    """Drops old partitions, then deletes terminal rows left behind in batches; ttl 0
    disables it entirely."""

    store: Store
    ttl: timedelta
    batch: int
    every: Every
    max_batches: int = RETENTION_MAX_BATCHES
    partition_interval: timedelta = DEFAULT_PARTITION_INTERVAL
    max_drops: int = RETENTION_MAX_DROPS
    backlog: bool = field(default=False, init=False)
    dropped: list[DroppedPartition] = field(default_factory=list, init=False)
    """The partitions the last pass dropped."""

    @property
    def enabled(self) -> bool:
        """False when the TTL is zero: zero never means "delete everything"."""
        return self.ttl > timedelta(0)

    def run_once(self) -> list[TopicCount]:
        """Drop what partitions may go (at most ``max_drops``), then delete batches until one
        comes back short, at most ``max_batches``; warn on backlog; the rows deleted by topic.

        A backlog makes the next tick due at once, so a caller that sets
        ``max_batches`` to 1 spreads a large deletion over its ticks.
        """
        if not self.enabled:
            return []
        self.dropped = self.store.drop_partitions(self.ttl, self.max_drops)
        for part in self.dropped:
            log.info(
                "RetentionDropped",
                extra={"event": "RetentionDropped", "partition": part.name, "rows": part.rows},
            )
        if len(self.dropped) == self.max_drops:
            self.every.hurry()  # more may go: the next tick goes on
        # Row by row only what no drop will take (see the module's docstring).
        row_ttl = self.ttl + self.partition_interval
        deleted: list[TopicCount] = []
        for _ in range(self.max_batches):
            counts = self.store.delete_terminal(row_ttl, self.batch)
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
