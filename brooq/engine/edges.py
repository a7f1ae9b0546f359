"""How jobs with parents are written: each one's state, counter and edges at enqueue. Pure.

Both stores plan an enqueue of jobs with parents (``Job(after=…)``, a workflow) here,
from the states of the parents that already exist, then write the plan in one statement:

- an edge to a parent that has ended records that end (``done``, ``dead``, ``canceled``);
  an edge to a parent not ended yet (or one of the same enqueue that is not canceled by
  it) stays open (None), and so does one to a parent the enqueue cannot see: it may be
  written by a transaction that has not committed yet. The reaper's safety net resolves
  such an edge as ``missing`` once its child is `MISSING_PARENT_GRACE` old and the parent
  still cannot be seen;
- a job whose resolved parents include a failed one (dead, canceled, missing) and whose
  policy is ``cancel`` is written ``canceled``, with a reason naming the first such parent
  by id (what the store's statement names when a parent fails later);
- otherwise it waits (``waiting``) while it has open edges, else it is ``pending``.

The jobs of one enqueue are planned parents first, so a job canceled at enqueue cancels
the jobs of the same enqueue that wait for it (by their policies), as a later cancel would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from brooq.vocabulary import TERMINAL_STATES, InvalidJob, Job, Node, State

MISSING = "missing"
"""An edge's record of a parent that does not exist (never did, or was deleted by hand)."""
EDGE_ENDS = ("done", "dead", "canceled", MISSING)
"""What an edge records of its parent once resolved (None while the parent has not ended)."""
MISSING_PARENT_GRACE = timedelta(minutes=10)
"""How long an edge to a parent nobody can see stays open (from its child's creation, on the
database's clock) before the reaper resolves it as missing: the parent may be written by a
transaction still open (``enqueue(parent, conn=…)`` not committed when the child, on another
connection, was). Twice the idle-transaction bound docs/operations.md recommends (5 min)."""


@dataclass(frozen=True, slots=True)
class Planned:
    """One job as an enqueue writes it."""

    id: str
    job: Job
    parents: tuple[tuple[str, str | None], ...]
    """Each parent's id and what its edge records (None: the parent has not ended)."""
    state: State
    reason: str | None = None
    """``last_error`` of a job canceled at enqueue."""
    workflow_id: str | None = None

    @property
    def parents_left(self) -> int:
        """The parents it waits for: its open edges."""
        return sum(end is None for _, end in self.parents)

    @property
    def policy(self) -> str | None:
        """``if_parent_fails`` as written: None for a job without parents."""
        return self.job.if_parent_fails if self.parents else None


def cancel_reason(parent_id: str, end: str) -> str:
    """``last_error`` of a job canceled because ``parent_id`` ended ``end`` (the same text
    the store's statements write)."""
    if end == MISSING:
        return f"canceled: parent {parent_id} does not exist"
    return f"canceled: parent {parent_id} ended {end}"


def fate(job: Job, parents: Sequence[tuple[str, str | None]]) -> tuple[State, str | None]:
    """The state (and cancel reason) of ``job`` with edges ``parents`` at enqueue."""
    failed = sorted((p, end) for p, end in parents if end is not None and end != "done")
    if failed and job.if_parent_fails == "cancel":
        return State.CANCELED, cancel_reason(*failed[0])
    if any(end is None for _, end in parents):
        return State.WAITING, None
    return State.PENDING, None


def plan(
    nodes: Sequence[Node], known: Mapping[str, State], workflow_id: str | None = None
) -> list[Planned]:
    """The jobs of ``nodes`` (parents before children among them) as they are written.

    ``known`` holds the state of every parent outside ``nodes`` that exists (that the
    enqueue can see); an edge to a parent in neither stays open (see the module).
    """
    planned: dict[str, Planned] = {}
    for node in nodes:
        edges = []
        for parent in node.parents:
            if parent in planned:
                end = "canceled" if planned[parent].state is State.CANCELED else None
            elif parent in known:
                state = known[parent]
                end = str(state) if state in TERMINAL_STATES else None
            else:
                end = None  # not visible yet, or never: the reaper's safety net decides
            edges.append((parent, end))
        state, reason = fate(node.job, edges)
        planned[node.id] = Planned(node.id, node.job, tuple(edges), state, reason, workflow_id)
    return list(planned.values())


def outside(nodes: Sequence[Node]) -> list[str]:
    """The parents ``nodes`` name that are not among them (their states are read first)."""
    inside = {n.id for n in nodes}
    return sorted({p for n in nodes for p in n.parents if p not in inside})


def enqueued_twice(workflow_id: str) -> InvalidJob:
    """The error of a workflow enqueued a second time (its jobs' ids exist)."""
    return InvalidJob(
        f"workflow {workflow_id} was enqueued already (its jobs exist); build a new Workflow "
        "to enqueue the same jobs again"
    )
