"""The in-memory store's edges: jobs that wait for other jobs, resolved as PostgreSQL does.

Every write that ends jobs calls :meth:`FakeGraph._resolve` with them, as every statement
of queries.sql that ends jobs runs the ``resolve_children`` fragment: the same doomed
children (waiting, policy ``cancel``, transitively), the same edges resolved once, the
same counters, states, reasons and times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from brooq.engine.edges import (
    EDGE_ENDS,
    MISSING,
    MISSING_PARENT_GRACE,
    Planned,
    cancel_reason,
    outside,
    plan,
)
from brooq.engine.fake.table import FakeTable
from brooq.vocabulary import (
    TERMINAL_STATES,
    Enqueued,
    JobRecord,
    Node,
    Parent,
    State,
    decode_payload,
    encode_payload,
)

FAILING = ("dead", "canceled", MISSING)


class FakeGraph(FakeTable):
    """The edges of the in-memory ``job_edge`` table, beside the rows."""

    def __init__(
        self, clock: Callable[[], datetime] | None = None, app_version: str | None = None
    ) -> None:
        super().__init__(clock, app_version)
        self.edges: dict[str, dict[str, str | None]] = {}
        """child id → {parent id: what the edge records (None: open)}."""
        self.children: dict[str, set[str]] = {}
        """parent id → its children's ids."""

    def _enqueue_graph(self, nodes: Sequence[Node], workflow_id: str | None) -> list[Enqueued]:
        """Write ``nodes`` as planned from the parents' states now (the lock is held)."""
        known = {p: self.rows[p].state for p in outside(nodes) if p in self.rows}
        out = {}
        for planned in plan(nodes, known, workflow_id):
            out[planned.id] = self._insert_planned(planned)
        return [out[n.id] for n in nodes]

    def _insert_planned(self, planned: Planned) -> Enqueued:
        job = planned.job
        if job.idempotency_key is not None:
            for row in self.rows.values():
                if row.topic == job.topic and row.idempotency_key == job.idempotency_key:
                    return Enqueued(row.id, False, row.state)
        now = self.now()
        self.rows[planned.id] = JobRecord(
            id=planned.id,
            topic=job.topic,
            payload=decode_payload(encode_payload(job.payload)),
            state=planned.state,
            attempts=0,
            available_at=job.available_at or now,
            locked_by=None,
            locked_until=None,
            idempotency_key=job.idempotency_key,
            priority=job.priority,
            rate_key=job.rate_key,
            app_version=self.app_version,
            **job.controls(),
            last_error=planned.reason,
            created_at=now,
            updated_at=now,
            workflow_id=planned.workflow_id,
            parents_left=planned.parents_left,
            if_parent_fails=planned.policy,
        )
        for parent, end in planned.parents:
            self.edges.setdefault(planned.id, {})[parent] = end
            self.children.setdefault(parent, set()).add(planned.id)
        return Enqueued(planned.id, True, planned.state)

    def _resolve(self, ended: Sequence[tuple[str, str]], now: datetime) -> None:
        """Resolve the open edges of the jobs just ended (``(id, state)``), as one statement."""
        ended_ids = {job_id for job_id, _ in ended}
        doomed = self._doomed([j for j, s in ended if s in FAILING], ended_ids)
        ending = [(j, s) for j, s in ended if s in EDGE_ENDS] + [(d, "canceled") for d in doomed]
        tally: dict[str, list[tuple[str, str]]] = {}
        for parent, end in ending:
            for child in self.children.get(parent, ()):
                if self.edges[child][parent] is None:
                    self.edges[child][parent] = end
                    if child not in ended_ids:
                        tally.setdefault(child, []).append((parent, end))
        for child in sorted(tally):
            row = self.rows.get(child)
            if row is not None:
                self.rows[child] = _released(row, tally[child], now)
        if any(self.rows[c].state is State.CANCELED for c in tally if c in self.rows):
            self._ended_some()

    def _doomed(self, failing: list[str], ended: set[str]) -> list[str]:
        """The waiting children with policy cancel of ``failing``, and theirs, transitively."""
        doomed: list[str] = []
        frontier = failing
        while frontier:
            found = []
            for parent in frontier:
                for child in sorted(self.children.get(parent, ())):
                    row = self.rows.get(child)
                    if (
                        self.edges[child][parent] is None
                        and child not in ended
                        and child not in doomed
                        and row is not None
                        and row.state is State.WAITING
                        and row.if_parent_fails == "cancel"
                    ):
                        doomed.append(child)
                        found.append(child)
            frontier = found
        return doomed

    def _forget_edges(self, child: str) -> None:
        """A deleted child's edges leave with it."""
        for parent in self.edges.pop(child, {}):
            kids = self.children.get(parent)
            if kids is not None:
                kids.discard(child)
                if not kids:
                    del self.children[parent]

    def _waited_for(self, job_id: str) -> bool:
        """True while a child of ``job_id`` has not ended (retention leaves such a parent)."""
        return any(
            (row := self.rows.get(child)) is not None and row.state not in TERMINAL_STATES
            for child in self.children.get(job_id, ())
        )

    def parents(self, job_id: str) -> dict[str, Parent]:
        """What the job sees of its parents: state now (or as recorded) and result."""
        with self._lock:
            key = self.get(job_id).id
            out = {}
            for parent, end in sorted(self.edges.get(key, {}).items()):
                row = self.rows.get(parent)
                if row is not None:
                    out[parent] = Parent(row.state, row.result)
                else:
                    out[parent] = Parent(State(end) if end and end != MISSING else None)
            return out

    def resolve_stranded(self, batch: int = 1000) -> int:
        """Resolve open edges whose parent has ended, or is gone while every open edge to it
        is older than MISSING_PARENT_GRACE (the reaper's safety net)."""
        with self._lock:
            now = self.now()
            waiting: dict[str, list[str]] = {}
            for child, edges in self.edges.items():
                for parent, end in edges.items():
                    if end is None:
                        waiting.setdefault(parent, []).append(child)
            stranded = [
                (p, str(self.rows[p].state) if p in self.rows else MISSING)
                for p in sorted(waiting)
                if (p in self.rows and self.rows[p].state in TERMINAL_STATES)
                or (p not in self.rows and _past_grace(self.rows, waiting[p], now))
            ][:batch]
            before = _open_count(self.edges)
            self._resolve(stranded, now)
            return before - _open_count(self.edges)


def _past_grace(rows: dict[str, JobRecord], children: list[str], now: datetime) -> bool:
    """True when every child in ``children`` (still a row) was created before the grace."""
    return all(
        row.created_at <= now - MISSING_PARENT_GRACE
        for child in children
        if (row := rows.get(child)) is not None
    )


def _released(row: JobRecord, resolved: list[tuple[str, str]], now: datetime) -> JobRecord:
    """``row`` once ``resolved`` (its parents' ends) are resolved: fate of resolve_children."""
    left = row.parents_left - len(resolved)
    changes: dict[str, Any] = {"parents_left": left}
    if row.state is State.WAITING:
        failed = sorted((p, end) for p, end in resolved if end != "done")
        if failed and row.if_parent_fails == "cancel":
            changes.update(state=State.CANCELED, last_error=cancel_reason(*failed[0]))
        elif left <= 0:
            changes.update(state=State.PENDING, available_at=max(row.available_at, now))
        if "state" in changes:
            changes["updated_at"] = now
    return replace(row, **changes)


def _open_count(edges: dict[str, dict[str, str | None]]) -> int:
    return sum(end is None for parents in edges.values() for end in parents.values())
