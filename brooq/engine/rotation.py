"""Weighted round robin over a fair topic's keys (issue 34), the order both stores follow.

Within one priority the keys with ready jobs take turns in key order, each ``weight`` jobs a
turn, from a cursor: the key served last and the jobs it took in that turn. The cursor is the
whole state of a fair topic (``brooq_fair_cursor`` on PostgreSQL, read and written under the
topic's claim lock), so the claims of every host are one sequence of turns. A key with no
ready job is not in the rotation (a key alone gets everything); a key that comes back after a
pause takes its place in key order, with no credit for the pause.

The order of a claim is a key's jobs by *round*: the key first in the rotation (the cursor's
own, when its turn is not used up) takes ``weight - used`` jobs in round 0, every other key
``weight``; each later round ``weight`` more. Jobs go by round, then the key's place in the
rotation, then the key's own order. So the first ``n`` jobs of the order come from at most
``n`` keys after the cursor, which is what lets the PostgreSQL claim walk that many keys
however many have ready jobs (docs/architecture.md, "Fair claiming").
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from brooq.vocabulary import Fairness
from brooq.vocabulary.fairness import MAX_WEIGHT

T = TypeVar("T")

NO_KEY = ""
"""The key of the jobs without a rate_key (they share one turn); it sorts first."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a fair topic's turns stand: the key served last and the jobs it has taken in
    its current turn. The default (no claim yet) is the turn of jobs without a key, used up:
    the first claim starts at the first key."""

    key: str = NO_KEY
    used: int = MAX_WEIGHT

    def continues(self, fairness: Fairness) -> bool:
        """Whether the cursor's key has jobs left in its turn."""
        return self.used < fairness.weight(self.key or None)


@dataclass(frozen=True, slots=True)
class Turn:
    """Where a job falls in the rotation: its key, its round, and the jobs its key had taken
    in that turn before this claim (the cursor's ``used`` for round 0 of its own key)."""

    key: str
    round: int
    base: int = 0


def rotation(keys: Iterable[str], cursor: Cursor, fairness: Fairness) -> list[str]:
    """``keys`` (those with ready jobs, '' for jobs without one) in the order they take turns:
    the cursor's key first if its turn goes on, else the keys after it, wrapping round."""
    ordered = sorted(set(keys))
    cut = bisect_left if cursor.continues(fairness) else bisect_right
    at = cut(ordered, cursor.key)
    return ordered[at:] + ordered[:at]


def first_quota(index: int, key: str, cursor: Cursor, fairness: Fairness) -> tuple[int, int]:
    """The jobs ``key`` (at ``index`` in the rotation) takes in round 0, and its base."""
    weight = fairness.weight(key or None)
    base = cursor.used if index == 0 and key == cursor.key and cursor.continues(fairness) else 0
    return weight - base, base


def turns(
    order: Sequence[str],
    rows: Mapping[str, Sequence[T]],
    cursor: Cursor,
    fairness: Fairness,
) -> list[tuple[T, Turn]]:
    """The ``rows`` of each key of ``order`` (each key's in its claim order, one priority) in
    the order the turns take them, each with its turn."""
    placed: list[tuple[tuple[int, int, int], T, Turn]] = []
    for index, key in enumerate(order):
        weight = fairness.weight(key or None)
        first, base = first_quota(index, key, cursor, fairness)
        for place, row in enumerate(rows.get(key, ())):
            at = 0 if place < first else 1 + (place - first) // weight
            placed.append(((at, index, place), row, Turn(key, at, base if at == 0 else 0)))
    placed.sort(key=lambda p: p[0])
    return [(row, turn) for _, row, turn in placed]


def advance(cursor: Cursor, taken: Sequence[Turn]) -> Cursor:
    """The cursor after a claim took jobs of one priority with these turns (in turn order)."""
    if not taken:
        return cursor
    last = taken[-1]
    used = sum(1 for t in taken if t.key == last.key and t.round == last.round)
    return Cursor(last.key, last.base + used)
