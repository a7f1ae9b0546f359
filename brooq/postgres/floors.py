"""Claims from floors: where each priority level of a topic is read from next.

A claim that read a topic's claim index from its start would walk, at every claim, the
index entries of every row claimed before: entries a vacuum removes, unless a session
holds a snapshot open (a ``pg_dump``, a report, a transaction left idle), and then they
pile up and every claim pays for all of them. A claimer therefore keeps, per topic and
priority level, its **floor**: the place in claim order ``(available_at, id)`` after which
it has claimed nothing, and reads each level from there (``claim_floors``). The rows it
leaves behind a floor are claimed, or were locked by someone else when it passed them.

How a ready row can be behind a floor, and how it is found again:

- **made ready late** (an enqueue whose transaction began before the claim and committed
  after it, an explicit past ``available_at``, a retarget, a hand-made UPDATE): the row
  carries the id of the transaction that made it ready (``job.ready_xid``, migration
  0017); each claim first asks for the rows committed since its previous look (the
  look that opens ``claim_floors``) and lowers a level's floor to the earliest of them.
  A row made ready by a retry, a release, the reaper or a workflow is never behind: its
  ``available_at`` is at least the time it was made ready, after every floor's;
- **passed over by SKIP LOCKED** (locked by another claimer, or by a cancel, that then let
  it go): every ``SWEEP_S`` the floors go back to where they were at the previous sweep,
  so such a row waits at most about two sweeps; every ``FULL_SWEEP_S`` they go back to
  the start of each level, for a row that stayed locked across two sweeps;
- **a level the claimer has not seen**: its rows are fresh, or were there when the
  claimer began (``claim_levels`` reads the levels once, with the snapshot fresh rows are
  counted from).

So a claim walks the entries of the rows claimed since its own previous claim, and a
sweep those of one sweep interval; only the full sweep, once a minute, walks the history
of a held snapshot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from brooq.postgres.connect import Connector
from brooq.postgres.rows import Row
from brooq.postgres.sql import sql

SWEEP_S = 5.0
"""How often a topic's floors go back to where they were at the previous sweep."""
FULL_SWEEP_S = 60.0
"""How often a sweep goes back to the start of every level instead (a row held locked by
another session across two sweeps)."""

START = (datetime.min.replace(tzinfo=UTC), "00000000-0000-0000-0000-000000000000")
"""The floor of a level read from its start (every ready row is after it)."""

Place = tuple[datetime, str]
"""A place in a level's claim order: ``(available_at, id)``."""


@dataclass
class TopicFloors:
    """One topic's floors, the snapshot of its claimer's previous look and its sweeps."""

    seen: str
    """The snapshot (``pg_snapshot`` text) of the previous look for fresh rows."""
    seen_everywhere: str
    """The snapshot of the previous look in every partition (at a sweep): the other looks
    read only the partitions of the last ten minutes' ids, where inserts land."""
    floors: dict[int, Place]
    """Per priority level: the place after which this claimer has not claimed."""
    low: dict[int, Place] = field(default_factory=dict)
    """Where the next sweep goes back to: the floors at the previous sweep, or lower
    (a fresh row found since)."""

    def __post_init__(self) -> None:
        self.low = dict(self.floors)

    def lower(self, level: int, place: Place) -> bool:
        """Move ``level``'s floor back to ``place`` if it is behind it; True if it moved."""
        floor = self.floors.get(level)
        if floor is not None and floor <= place:
            return False
        self.floors[level] = place
        if level not in self.low or place < self.low[level]:
            self.low[level] = place
        return True

    def advance(self, level: int, place: Place, used: Place) -> None:
        """Move ``level``'s floor on to ``place`` (a row just claimed from floor ``used``),
        never back, and not at all if the floor went back behind ``used`` meanwhile (a
        fresh row found by another claim of this topic: it must still be read)."""
        floor = self.floors.get(level, START)
        if floor >= used and place > floor:
            self.floors[level] = place

    def sweep(self, full: bool = False) -> None:
        """Go back to where the floors were at the previous sweep (to the start of every
        level when ``full``), so the next claim reads the last interval again; the next
        sweep goes back to where they are now."""
        frontier = dict(self.floors)
        if full:
            self.floors = dict.fromkeys(self.floors, START)
        else:
            self.floors = {
                level: min(place, self.low.get(level, place))
                for level, place in self.floors.items()
            }
        self.low = frontier


class Floors:
    """The floors of every topic one store claims from, safe to share between threads.

    Two claims at once read the same floors and each moves them on by what it took; a
    floor moved past a row the other one then gave back is mended by the next sweep.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._topics: dict[str, TopicFloors] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._swept = self._swept_all = clock()

    def unknown(self, topics: list[str]) -> list[str]:
        """The ``topics`` whose levels have not been read yet (begin)."""
        return [t for t in topics if t not in self._topics]

    def begin(self, topic: str, seen: str, levels: list[int]) -> None:
        """Start ``topic`` at the start of each of its ``levels``, fresh rows counted from
        ``seen`` (what claim_levels returned)."""
        with self._lock:
            self._topics[topic] = TopicFloors(seen, seen, {level: START for level in levels})

    def look(self, topics: list[str]) -> dict[str, Any]:
        """claim_floors' parameters for a claim of ``topics``: per topic, the snapshot to
        look for fresh rows from and where (every partition at a sweep, else the newest),
        and per topic and level (highest first), its floor."""
        now = self._clock()
        names = ("topics", "seen", "floor_topics", "levels", "ats", "ids")
        arrays: dict[str, Any] = {name: [] for name in names}
        with self._lock:
            sweep = now - self._swept >= SWEEP_S
            full = sweep and now - self._swept_all >= FULL_SWEEP_S
            if sweep:
                self._swept = now
            if full:
                self._swept_all = now
            arrays["everywhere"] = sweep
            for topic in topics:
                state = self._topics[topic]
                if sweep:
                    state.sweep(full)
                arrays["topics"].append(topic)
                arrays["seen"].append(state.seen_everywhere if sweep else state.seen)
                for level in sorted(state.floors, reverse=True):
                    at, job_id = state.floors[level]
                    arrays["floor_topics"].append(topic)
                    arrays["levels"].append(level)
                    arrays["ats"].append(at)
                    arrays["ids"].append(job_id)
        return arrays

    def claimed(
        self,
        used: dict[str, Any],
        fresh: list[tuple[str, int | None, datetime | None, str]],
        places: list[tuple[str, int, datetime, str]],
    ) -> None:
        """Record a claim from the floors ``used`` (what look returned): its look (the
        ``fresh`` rows of claim_floors: topic, level, earliest place, snapshot) moves
        floors back, as the claim did before it read; then the rows it claimed
        (``(topic, priority, available_at, id)``) move them on."""
        start = {
            (t, p): (at, i)
            for t, p, at, i in zip(
                used["floor_topics"], used["levels"], used["ats"], used["ids"], strict=True
            )
        }
        with self._lock:
            for topic, level, at, seen in fresh:
                state = self._topics.get(topic)
                if state is None:
                    continue
                state.seen = seen
                if used["everywhere"]:
                    state.seen_everywhere = seen
                if level is not None and at is not None:
                    place = (at, START[1])
                    state.lower(level, place)
                    start[topic, level] = min(start.get((topic, level), place), place)
            for topic, level, at, job_id in places:
                state = self._topics.get(topic)
                if state is not None:
                    state.advance(level, (at, job_id), start.get((topic, level), START))


def claim_from_floors(
    connector: Connector, floors: Floors, topics: list[str], params: dict[str, Any]
) -> list[Row]:
    """Claim up to ``params["limit"]`` ready jobs of ``topics`` from their floors, in
    claim order, as claimed_columns rows (``holder``, ``lease``, ``limit`` and
    ``app_version`` in ``params``): one statement, which first looks for rows made ready
    behind a floor. A topic met for the first time has its levels read first."""
    with connector.connection() as conn:
        for topic in floors.unknown(topics):
            row = conn.execute(sql("claim_levels"), {"topic": topic}).fetchone()
            seen, levels = row if row is not None else ("", [])
            floors.begin(topic, seen, list(levels))
        used = floors.look(topics)
        rows = conn.execute(sql("claim_floors"), {**params, **used}).fetchall()
    claimed = [r for r in rows if r[0] is not None]
    fresh = [(r[1], r[6], r[7], r[2]) for r in rows if r[0] is None]
    floors.claimed(used, fresh, [(r[1], r[6], r[7], str(r[0])) for r in claimed])
    return claimed
