"""An interval timer on the monotonic clock, passed in so that tests need no sleeping."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass
class Every:
    """Due every ``period`` (monotonic seconds), the first time at once.

    ``due`` reschedules before the caller works, so an error in the work never
    loses the next run (psycopg_pool's maintenance tasks do the same).
    """

    period: timedelta
    next_at: float = 0.0

    def due(self, now: float) -> bool:
        """True when a run is due; the next one is scheduled first."""
        if now < self.next_at:
            return False
        self.next_at = now + self.period.total_seconds()
        return True

    def hurry(self) -> None:
        """Make the next call to :meth:`due` return True (work was left for the next tick)."""
        self.next_at = 0.0

    def retry_within(self, now: float, seconds: float) -> None:
        """Make a run due at ``now + seconds`` at the latest (the last one failed)."""
        self.next_at = min(self.next_at, now + seconds)
