"""When the supervisor's loop runs: how long it sleeps, and which steps are due.

The loop wakes for whatever is ready (a worker's report, a database result,
a signal, a NOTIFY) or a deadline. Two rules keep its own cost per batch,
not per job: while workers report and every one has work queued, it first
lets half of the least of that work go by (MIN_GAP_S to MAX_GAP_S), so what
they write meanwhile is read in one pass (no worker waits: each queue still
holds a job); and the steps about the processes themselves (spawn, health,
registration) run every HOUSEKEEPING_S, or at once after a signal or an exit.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

MAX_TICK_S = 1.0
"""The longest the loop sleeps when nothing is held."""
BUSY_TICK_S = 0.1
"""The longest it sleeps while it holds jobs or stops."""
MIN_GAP_S = 0.001
MAX_GAP_S = 0.02
"""While workers report, the loop runs at most every MIN_GAP_S, and less often while their
queues hold more work (up to MAX_GAP_S)."""
HOUSEKEEPING_S = 0.05


class Pacer:
    """The loop's clock: the gap before a wait, the wait's timeout, the housekeeping."""

    def __init__(self) -> None:
        self.ticked_at = 0.0
        self.reading = False
        """The last tick read what workers sent: the next one may wait for more."""
        self.poked = True
        """A signal or an exit asks for the housekeeping steps now."""
        self.reap_due = True
        """A SIGCHLD came: reap now."""
        self.next_housekeeping = 0.0

    def tick(self, now: float, reading: bool) -> None:
        """A tick starts at ``now``; ``reading``: it found workers' reports to read."""
        self.ticked_at, self.reading = now, reading

    def gap(self, slack: float) -> None:
        """Before a wait: sleep what is left of the gap while workers have ``slack`` seconds
        of work queued (nothing when the last tick read no report)."""
        if not self.reading:
            return
        now = time.monotonic()
        gap = min(MAX_GAP_S, max(MIN_GAP_S, slack / 2))
        if (rest := self.ticked_at + gap - now) > 0:
            time.sleep(rest)

    @staticmethod
    def timeout(now: float, deadlines: Iterable[float], busy: bool) -> float:
        """Seconds until the first of ``deadlines``, at most BUSY_TICK_S or MAX_TICK_S."""
        cap = BUSY_TICK_S if busy else MAX_TICK_S
        return max(0.0, min([cap] + [d - now for d in deadlines]))

    def housekeeping_due(self, now: float) -> bool:
        """True every HOUSEKEEPING_S, and right after a signal or an exit."""
        if not self.poked and now < self.next_housekeeping:
            return False
        self.poked, self.next_housekeeping = False, now + HOUSEKEEPING_S
        return True

    def reap_now(self, now: float) -> bool:
        """True after a SIGCHLD, and at every housekeeping (in case one was lost)."""
        if not self.reap_due and now < self.next_housekeeping:
            return False
        self.reap_due = False
        return True
