"""Partitions of the job table, created ahead so that new rows never land in the default one.

The table is split by ranges of job ids, which are ranges of creation time
(UUIDv7). Every supervisor (and ``brooq work``) runs this upkeep; the store
makes sure only one host creates at a time, and that a busy lock is waited
for only a moment (the next tick goes on).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from brooq.engine.store import Store
from brooq.engine.timer import Every

log = logging.getLogger("brooq.partitions")

DEFAULT_PARTITION_INTERVAL = timedelta(days=1)
PARTITIONS_AHEAD = 3
"""Intervals covered ahead of now: rows land in the default partition only when no
supervisor has run for that long."""
PARTITIONS_PER_TICK = 4
"""At most this many created a tick: each takes locks, however briefly."""
PARTITION_CHECK = timedelta(minutes=1)
"""How often the upkeep looks (a catalog read when there is nothing to create)."""


@dataclass
class PartitionUpkeep:
    """Creates the partitions of the next ``PARTITIONS_AHEAD`` intervals, a few a tick."""

    store: Store
    interval: timedelta = DEFAULT_PARTITION_INTERVAL
    every: Every = field(default_factory=lambda: Every(PARTITION_CHECK))

    def run_once(self) -> list[str]:
        """Create what is missing ahead (at most PARTITIONS_PER_TICK); the names created."""
        made = self.store.add_partitions(
            self.interval, self.interval * PARTITIONS_AHEAD, PARTITIONS_PER_TICK
        )
        if made:
            log.info(
                "PartitionsCreated",
                extra={"event": "PartitionsCreated", "partitions": ",".join(made)},
            )
        if len(made) == PARTITIONS_PER_TICK:
            self.every.hurry()  # more to create: the next tick goes on
        return made

    def tick(self, now: float) -> list[str]:
        """Run when due; otherwise do nothing."""
        return self.run_once() if self.every.due(now) else []
