"""Paused topics, as the supervisor knows them, and what a pause does to its jobs.

The claims store reads the paused topics before a claim once its view is PAUSE_REFRESH_S
old; the loop reads them on the claims lane when no claim did (an idle producer), and
at once when the LISTEN thread hears ``NOTIFY brooq_pause``. A topic newly paused gets
every job of it the supervisor holds unstarted (in the buffer, or queued in a worker)
given back uncharged; jobs of it already running finish. A claim that was under way
when the pause was read may still bring jobs of the topic: the loop gives those back
too, before any of them reaches a worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from brooq.engine.pauses import PauseView
from brooq.logs import event
from brooq.supervisor.database import Database

log = logging.getLogger("brooq.supervisor")

LOOP_READ_AFTER = 1.5
"""The loop reads the paused topics itself once the view is this many PAUSE_REFRESH_S old
(0.75 s): a producer that claims reads them first, in its claim's task, at 0.5 s, so the
loop adds no statement beside its claims; an idle one still learns of a pause within a
second."""


class PausedTopics:
    """Keeps the claims store's view of the paused topics fresh and applies what changed
    (``on_paused`` gets the topics newly paused; the caller gives their unstarted jobs
    back). A claim reads the view again itself when it is old, so while the producer
    claims, no read of its own is needed; this one reads only when the view grew old
    without a claim, or when ``NOTIFY brooq_pause`` was heard."""

    def __init__(
        self, lane: Database, view: PauseView, on_paused: Callable[[set[str]], None]
    ) -> None:
        self.lane, self.view, self.on_paused = lane, view, on_paused
        self.applied: frozenset[str] = frozenset()
        self.asking = False

    @property
    def topics(self) -> frozenset[str]:
        """The topics paused now, as the loop has applied them."""
        return self.applied

    def heard(self, pauses: bool) -> None:
        """``pauses``: NOTIFY brooq_pause was heard; read again before the next claim."""
        if pauses:
            self.view.forget()

    def run_once(self, now: float) -> None:
        """Apply what the last read found; read when the view is old (one read at a time)."""
        self.apply()
        if self.asking or not self.view.stale(after=LOOP_READ_AFTER * self.view.every):
            return
        self.asking = True

        def done(_: object, error: BaseException | None) -> None:
            self.asking = False
            self.apply()

        self.lane.submit("pauses", self.view.refresh, done)

    def apply(self) -> None:
        """Take in the paused topics last read: the log, the jobs held."""
        paused = self.view.paused
        if paused == self.applied:
            return
        newly, lifted = paused - self.applied, self.applied - paused
        self.applied = paused
        for topic in sorted(newly):
            event(log, "TopicPaused", topic=topic)
        for topic in sorted(lifted):
            event(log, "TopicResumed", topic=topic)
        if newly:
            self.on_paused(set(newly))
