"""Paused topics, as the supervisor knows them, and what a pause does to its jobs.

The loop reads the paused topics every PAUSE_REFRESH_S on the claims lane (and at once
when the LISTEN thread hears ``NOTIFY brooq_pause``). The claims store's own view is
kept by these reads, so a claim never reads them itself. A topic newly paused gets
every job of it the supervisor holds unstarted (in the buffer, or queued in a worker)
given back uncharged; jobs of it already running finish. A claim that was under way
when the pause was read may still bring jobs of the topic: the loop gives those back
too, before any of them reaches a worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from brooq.engine.pauses import PAUSE_REFRESH_S, PauseView
from brooq.engine.store import Store
from brooq.logs import event
from brooq.supervisor.database import Database
from brooq.vocabulary import TopicPause

log = logging.getLogger("brooq.supervisor")


class PausedTopics:
    """Reads the paused topics and applies what changed (``on_paused`` gets the topics
    newly paused; the caller gives their unstarted jobs back)."""

    def __init__(
        self,
        store: Store,
        lane: Database,
        view: PauseView,
        on_paused: Callable[[set[str]], None],
        every: float = PAUSE_REFRESH_S,
    ) -> None:
        self.store, self.lane, self.view = store, lane, view
        self.on_paused, self.every = on_paused, every
        self.pauses: dict[str, TopicPause] = {}
        self.next_at = 0.0
        self.asking = False

    @property
    def topics(self) -> frozenset[str]:
        """The topics paused now, as last read."""
        return self.view.paused

    def heard(self, pauses: bool) -> None:
        """``pauses``: NOTIFY brooq_pause was heard; read again at the next tick."""
        if pauses:
            self.next_at = 0.0

    def run_once(self, now: float) -> None:
        """Read the paused topics when due (one read at a time)."""
        if self.asking or now < self.next_at:
            return
        self.asking = True

        def done(pauses: list[TopicPause] | None, error: BaseException | None) -> None:
            self.asking = False
            self.next_at = now + self.every
            if error is None and pauses is not None:
                self.apply(pauses)

        self.lane.submit("pauses", self.store.pauses, done)

    def apply(self, pauses: list[TopicPause]) -> None:
        """Take in the paused topics just read: the claims' view, the log, the jobs held."""
        was, now = self.pauses, {p.topic: p for p in pauses}
        self.pauses = now
        self.view.seen(set(now))
        for topic in sorted(now.keys() - was.keys()):
            p = now[topic]
            event(log, "TopicPaused", topic=topic, reason=p.reason, by=p.paused_by)
        for topic in sorted(was.keys() - now.keys()):
            event(log, "TopicResumed", topic=topic)
        if newly := now.keys() - was.keys():
            self.on_paused(set(newly))
