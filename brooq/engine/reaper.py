"""The reaper: jobs whose lease expired go back to ``pending`` (the holder's host died)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from brooq.engine.store import Store, TopicCount
from brooq.engine.timer import Every

log = logging.getLogger("brooq.reaper")


@dataclass
class Reaper:
    """Returns expired jobs to ``pending``, ``attempts`` untouched (invariant 7)."""

    store: Store
    every: Every

    def run_once(self) -> list[TopicCount]:
        """One pass; logs JobRequeued per topic and returns the counts."""
        counts = self.store.requeue_expired()
        for topic, n in counts:
            log.info("JobRequeued", extra={"event": "JobRequeued", "topic": topic, "count": n})
        return counts

    def tick(self, now: float) -> list[TopicCount]:
        """Run when due; otherwise do nothing."""
        return self.run_once() if self.every.due(now) else []
