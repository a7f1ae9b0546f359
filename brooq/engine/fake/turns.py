"""The turns of fair topics in the in-memory store: queries.sql ``claim_topic_fair`` (and,
for a rate-limited fair topic, ``claim_topic_rated``'s order within one claim)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from brooq.vocabulary import Fairness, JobRecord


class FairTurns:
    """Start-time fair queuing per fair topic: each key's finish, each topic's clock (the
    ``brooq_fair_turn`` and ``brooq_fair_clock`` tables)."""

    def __init__(self) -> None:
        self.finish: dict[tuple[str, str], float] = {}
        self.clock: dict[str, float] = {}
        self._starts: dict[tuple[str, str], float] = {}

    def order(
        self, ready: list[JobRecord], fair: Mapping[str, Fairness]
    ) -> tuple[list[JobRecord], dict[str, tuple[str, float]]]:
        """``ready`` (in claim order) in the order a claim takes them, and each fair row's
        (key, tag). A fair topic's rows go by priority, then tag: the key's start (the
        topic's clock, or the key's finish when later) plus its place among the key's ready
        rows over its weight (claim_topic_fair; claim_topic_rated on a rate-limited one)."""
        starts: dict[tuple[str, str], float] = {}
        places: Counter[tuple[str, str]] = Counter()
        tags: dict[str, tuple[str, float]] = {}
        for row in ready:
            if row.topic not in fair:
                continue
            key = row.rate_key or ""
            at = (row.topic, key)
            if at not in starts:
                clock = self.clock.get(row.topic, 0.0)
                starts[at] = max(clock, self.finish.get(at, clock))
            tags[row.id] = (key, starts[at] + places[at] / fair[row.topic].weight(row.rate_key))
            places[at] += 1
        self._starts = starts
        ordered = sorted(
            ready,
            key=lambda r: (
                -r.priority,
                tags[r.id][1] if r.id in tags else 0.0,
                r.available_at,
                r.id,
            ),
        )
        return ordered, tags

    def served(
        self,
        taken: Iterable[JobRecord],
        tags: Mapping[str, tuple[str, float]],
        fair: Mapping[str, Fairness],
    ) -> None:
        """Move each served key's finish past the jobs it was given, and each topic's clock
        to the last tag taken; forget keys the clock has passed."""
        jobs: Counter[tuple[str, str]] = Counter()
        last: dict[str, float] = {}
        for row in taken:
            at = (row.topic, tags[row.id][0])
            jobs[at] += 1
            last[row.topic] = max(last.get(row.topic, 0.0), tags[row.id][1])
        for (topic, key), n in jobs.items():
            self.finish[topic, key] = self._starts[topic, key] + n / fair[topic].weight(key or None)
        for topic, tag in last.items():
            clock = self.clock[topic] = max(self.clock.get(topic, 0.0), tag)
            for at in [a for a, f in self.finish.items() if a[0] == topic and f <= clock]:
                if at not in jobs:
                    del self.finish[at]
