"""The reaper: jobs whose lease expired go back to ``pending`` (their holder's host died)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from brooq.engine.store import Requeued, Store
from brooq.engine.timer import Every

log = logging.getLogger("brooq.reaper")

REAPER_BATCH = 1000


@dataclass
class Reaper:
    """Returns expired jobs to ``pending``, ``attempts`` untouched and the expiry counted.

    A job whose lease expired ``max_expirations`` times in a row (no outcome
    recorded between them; 0: never) is moved to
    ``dead`` instead (invariant 7). One bounded batch per run: when it comes
    back full the next tick goes on, so no tick holds its caller for long.
    """

    store: Store
    every: Every
    max_expirations: int = 5
    batch: int = REAPER_BATCH

    def run_once(self) -> Requeued:
        """One batch; logs JobRequeued and JobDead per topic and returns the counts.

        Then the safety net of workflows: edges whose parent ended without resolving them
        (its enqueue committed while the parent was ending), or whose parent is gone.
        """
        done = self.store.requeue_expired(self.max_expirations, self.batch)
        stranded = self.store.resolve_stranded(self.batch)
        if stranded:
            log.info(
                "EdgesResolved",
                extra={"event": "EdgesResolved", "count": stranded},
            )
        for topic, n in done.pending:
            log.info("JobRequeued", extra={"event": "JobRequeued", "topic": topic, "count": n})
        for topic, n in done.dead:
            log.warning(
                "JobDead",
                extra={
                    "event": "JobDead",
                    "topic": topic,
                    "count": n,
                    "error": f"lease expired {self.max_expirations} times in a row: its "
                    "holder died every time it ran; the job may be killing its host",
                },
            )
        if done.total >= self.batch:
            self.every.hurry()
        return done

    def tick(self, now: float) -> Requeued | None:
        """Run when due; None otherwise."""
        return self.run_once() if self.every.due(now) else None
