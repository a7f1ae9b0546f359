"""The Pauses port (pause, resume, list topics) and the claimers' view of it.

A pause is a row in the store, so it holds on every host and through restarts. Every
claimer reads the paused topics at most :data:`PAUSE_REFRESH_S` old before it claims
(a supervisor also at once when it hears ``NOTIFY brooq_pause``), so a paused topic
starts no new job anywhere within a second of the command. Jobs already claimed but not
started are given back uncharged by the supervisor that holds them; jobs running finish.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from brooq.vocabulary import TopicPause

PAUSE_REFRESH_S = 0.5
"""The oldest view of the paused topics a claimer claims with (half the promised second:
a claim under way when the pause commits still ends well within it)."""


class Pauses(Protocol):
    """Pause and resume topics across every host."""

    def pause(self, topic: str, reason: str | None = None, by: str | None = None) -> TopicPause:
        """Pause ``topic`` (valid, registered or not); pausing a paused topic keeps its
        ``paused_at`` and replaces reason and author. The pause as stored."""
        ...

    def resume(self, topic: str) -> TopicPause | None:
        """Lift the pause of ``topic``; the pause lifted, None when it was not paused."""
        ...

    def pauses(self) -> list[TopicPause]:
        """Every paused topic, by name."""
        ...


class PauseView:
    """The paused topics as a claimer last read them, read again once older than ``every``.

    ``load`` returns the names of the paused topics; when it fails the view keeps what it
    knew (a claim then fails the same way, so nothing is claimed on stale news)."""

    def __init__(
        self,
        load: Callable[[], set[str]],
        every: float = PAUSE_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.load, self.every, self.clock = load, every, clock
        self.paused: frozenset[str] = frozenset()
        self.read_at = float("-inf")

    def stale(self, after: float | None = None) -> bool:
        """True once the view is older than ``after`` (default ``every``: the next claim
        reads it again)."""
        return self.clock() - self.read_at >= (self.every if after is None else after)

    def refresh(self) -> frozenset[str]:
        """Read the paused topics now; what was read."""
        paused = frozenset(self.load())
        self.paused, self.read_at = paused, self.clock()
        return paused

    def active(self, topics: Sequence[str]) -> list[str]:
        """``topics`` without the paused ones, read again first when the view is old."""
        paused = self.refresh() if self.stale() else self.paused
        if not paused:
            return list(topics)
        return [t for t in topics if t not in paused]

    def forget(self) -> None:
        """Read again before the next claim (this process just paused or resumed a topic)."""
        self.read_at = float("-inf")
