"""The turns of fair topics in the in-memory store: the order of queries.sql ``fair_walk``
and ``claim_fair_turns`` (and ``claim_topic_rated`` on a rate-limited fair topic), computed
over every ready row (brooq.engine.rotation)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from brooq.engine.rotation import Cursor, Turn, advance, rotation, turns
from brooq.vocabulary import Fairness, JobRecord


class FairTurns:
    """Each fair topic's cursor (the ``brooq_fair_cursor`` table)."""

    def __init__(self) -> None:
        self.cursors: dict[str, Cursor] = {}

    def order(
        self, ready: list[JobRecord], fair: Mapping[str, Fairness]
    ) -> tuple[list[JobRecord], dict[str, tuple[int, Turn]]]:
        """``ready`` (in claim order) in the order a claim takes them, and each fair row's
        place in its topic's turns and its turn. A fair topic's rows go priority by priority;
        within one, by the turns from the cursor where the priority above left it (had the
        claim taken every row above)."""
        levels: dict[tuple[str, int], dict[str, list[JobRecord]]] = defaultdict(dict)
        for row in ready:
            if row.topic in fair:
                keys = levels[row.topic, row.priority]
                keys.setdefault(row.rate_key or "", []).append(row)
        placed: dict[str, tuple[int, Turn]] = {}
        for topic, fairness in fair.items():
            cursor = self.cursors.get(topic, Cursor())
            for priority in sorted({p for t, p in levels if t == topic}, reverse=True):
                rows = levels[topic, priority]
                ordered = turns(rotation(rows, cursor, fairness), rows, cursor, fairness)
                for row, turn in ordered:
                    placed[row.id] = (len(placed), turn)
                cursor = advance(cursor, [turn for _, turn in ordered])
        ordered_rows = sorted(
            ready,
            key=lambda r: (
                -r.priority,
                placed[r.id][0] if r.id in placed else 0,
                r.available_at,
                r.id,
            ),
        )
        return ordered_rows, placed

    def served(self, taken: Iterable[JobRecord], placed: Mapping[str, tuple[int, Turn]]) -> None:
        """Move each fair topic's cursor past the jobs a claim took (the last priority's)."""
        by_topic: dict[str, list[tuple[int, int, Turn]]] = defaultdict(list)
        for row in taken:
            if row.id in placed:
                at, turn = placed[row.id]
                by_topic[row.topic].append((-row.priority, at, turn))
        for topic, rows in by_topic.items():
            rows.sort(key=lambda r: (r[0], r[1]))
            last_level = rows[-1][0]
            level = [turn for p, _, turn in rows if p == last_level]
            self.cursors[topic] = advance(self.cursors.get(topic, Cursor()), level)
