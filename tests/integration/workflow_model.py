"""The state machine's model of workflows, written from the rules (docs/architecture.md,
"Workflows"), not from the stores' code: what a child is at enqueue, and what ending its
parents does to it.

- At enqueue each edge records a parent that has ended (its state), or nothing (the
  parent has not ended, or cannot be seen: it may not be committed yet; the reaper calls
  it ``missing`` only after MISSING_PARENT_GRACE). A failed parent (dead, canceled,
  missing) with policy ``cancel`` cancels the child, naming the first failed parent by id;
  else it waits while an edge is open, and is pending when none is.
- A write that ends jobs (one statement) resolves the open edges of those jobs; the waiting
  children with policy ``cancel`` of a failed one are canceled in the same write, and so
  on down (their edges end as ``canceled``); each child's counter of parents left drops by
  the edges resolved; a waiting child whose counter reaches 0 becomes pending (ready now,
  or at its own later time), one with a failed parent and policy ``cancel`` canceled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from brooq.vocabulary import State

TERMINAL = {State.DONE, State.DEAD, State.CANCELED}
FAILED = {"dead", "canceled", "missing"}


class Child(Protocol):
    """What the model knows of a job that has parents (the machine's M)."""

    id: str
    state: State
    policy: str | None
    left: int
    last_error: str | None
    order: int | None
    delayed: bool


def reason(parent: str, end: str) -> str:
    if end == "missing":
        return f"canceled: parent {parent} does not exist"
    return f"canceled: parent {parent} ended {end}"


@dataclass
class Graph:
    """The edges as the model expects them: child → {parent: end (None: open)}."""

    edges: dict[str, dict[str, str | None]] = field(default_factory=dict)
    children: dict[str, set[str]] = field(default_factory=dict)

    def plan(
        self, parents: list[str], policy: str, end_of: Callable[[str], str | None]
    ) -> tuple[dict[str, str | None], State, str | None]:
        """The edges, state and cancel reason of a child of ``parents`` at enqueue."""
        edges = {p: end_of(p) for p in dict.fromkeys(parents)}
        failed = sorted((p, e) for p, e in edges.items() if e in FAILED)
        if failed and policy == "cancel":
            return edges, State.CANCELED, reason(*failed[0])
        if any(e is None for e in edges.values()):
            return edges, State.WAITING, None
        return edges, State.PENDING, None

    def add(self, child: str, edges: dict[str, str | None]) -> None:
        self.edges[child] = dict(edges)
        for parent in edges:
            self.children.setdefault(parent, set()).add(child)

    def forget(self, child: str) -> None:
        for parent in self.edges.pop(child, {}):
            self.children.get(parent, set()).discard(child)

    def end(self, jobs: dict[str, Any], ended: list[tuple[str, State]], now: int) -> None:
        """One write ended ``ended``: resolve their edges as the stores must."""
        ended_ids = {j for j, _ in ended}
        doomed: list[str] = []
        frontier = [j for j, s in ended if str(s) in FAILED]
        while frontier:
            found = []
            for parent in frontier:
                for child in sorted(self.children.get(parent, ())):
                    m: Child | None = jobs.get(child)
                    if (
                        self.edges[child][parent] is None
                        and child not in ended_ids
                        and child not in doomed
                        and m is not None
                        and m.state is State.WAITING
                        and m.policy == "cancel"
                    ):
                        doomed.append(child)
                        found.append(child)
            frontier = found
        ending = [(j, str(s)) for j, s in ended if s in TERMINAL] + [
            (d, "canceled") for d in doomed
        ]
        tally: dict[str, list[tuple[str, str]]] = {}
        for parent, end in ending:
            for child in self.children.get(parent, ()):
                if self.edges[child][parent] is None:
                    self.edges[child][parent] = end
                    if child not in ended_ids:
                        tally.setdefault(child, []).append((parent, end))
        for child, resolved in tally.items():
            kid: Child = jobs[child]
            kid.left -= len(resolved)
            if kid.state is not State.WAITING:
                continue
            failed = sorted((p, e) for p, e in resolved if e in FAILED)
            if failed and kid.policy == "cancel":
                kid.state, kid.last_error = State.CANCELED, reason(*failed[0])
            elif kid.left <= 0:
                kid.state, kid.order = State.PENDING, None if kid.delayed else now

    def open_parents(self, child: str) -> list[str]:
        return [p for p, e in self.edges.get(child, {}).items() if e is None]

    def waited_for(self, jobs: dict[str, Any], parent: str) -> bool:
        """A child of ``parent`` has not ended (retention leaves the parent)."""
        return any(
            c in jobs and jobs[c].state not in TERMINAL for c in self.children.get(parent, ())
        )
