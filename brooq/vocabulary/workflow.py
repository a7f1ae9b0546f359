"""A workflow: a graph of jobs built in memory, then written in one transaction."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from brooq.vocabulary.errors import InvalidJob
from brooq.vocabulary.ids import new_job_id, new_job_ids, parse_job_id
from brooq.vocabulary.job import Job
from brooq.vocabulary.parents import HasJobId, parent_ids

MAX_WORKFLOW_JOBS = 100_000
"""The most jobs one workflow may hold (it is written in one statement)."""


@dataclass(frozen=True, slots=True)
class Handle:
    """A job added to a workflow: its id (known before anything is written) and the job."""

    id: str
    job: Job
    workflow_id: str


@dataclass(frozen=True, slots=True)
class Node:
    """One job of a workflow as the stores write it: its id, the job, and every parent id
    (the workflow's own jobs first in the order given, then jobs outside it)."""

    id: str
    job: Job
    parents: tuple[str, ...]


@dataclass
class Workflow:
    """A graph of jobs: each may wait for others (``wf.add(job, after=[handle, …])``).

    Nothing is written until ``queue.enqueue_workflow(wf)``, which writes every job in one
    transaction, each carrying ``wf.id`` (its ``workflow_id``). A job may wait for jobs
    added before it (their handles) and for jobs already enqueued (ids, or Enqueued values,
    in ``after`` or in the Job's own ``after``); a handle of another workflow, or of a job
    not added yet, is refused here, so the graph can hold no cycle. Jobs of a workflow
    carry no idempotency key: make the enqueue idempotent by writing the workflow in the
    transaction that records why it exists (``conn=``).
    """

    id: str = field(default_factory=new_job_id)
    _handles: dict[str, Handle] = field(default_factory=dict, repr=False)
    _after: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        try:
            self.id = parse_job_id(self.id)
        except ValueError as exc:
            raise InvalidJob(f"workflow id: {exc}") from None

    def add(self, job: Job, after: Iterable[Handle | str | HasJobId] = ()) -> Handle:
        """Add ``job``, waiting for ``after`` (handles of this workflow, or ids of jobs already
        enqueued) and for its own ``job.after``; its handle (``.id`` is the job's id)."""
        if not isinstance(job, Job):
            raise TypeError(f"Workflow.add takes a brooq.Job, not {type(job).__name__}")
        if job.idempotency_key is not None:
            raise InvalidJob(
                "a job of a workflow cannot carry an idempotency key; write the workflow in "
                "the transaction that records why it exists (enqueue_workflow(wf, conn=…))"
            )
        if len(self._handles) >= MAX_WORKFLOW_JOBS:
            raise InvalidJob(f"a workflow holds at most {MAX_WORKFLOW_JOBS} jobs")
        if isinstance(after, str | bytes):
            parent_ids(after)  # raises: a list of jobs is wanted, not one string
        listed = list(after)
        for item in listed:
            if isinstance(item, Handle) and self._handles.get(item.id) is not item:
                raise InvalidJob(
                    f"after: job {item.id} is not a job of this workflow (add it first, "
                    "to this workflow)"
                )
        ids = parent_ids(listed)
        handle = Handle(new_job_ids(1)[0], job, self.id)
        self._after[handle.id] = ids
        self._handles[handle.id] = handle
        return handle

    def __len__(self) -> int:
        return len(self._handles)

    def __iter__(self) -> Iterator[Handle]:
        """The handles, in the order they were added."""
        return iter(self._handles.values())

    def with_jobs(self, jobs: Sequence[Job]) -> Workflow:
        """This workflow (same id, same job ids and edges) with each job replaced by the one
        of ``jobs`` at its place (what an enqueue middleware returned); InvalidJob when they
        do not match one for one."""
        jobs = list(jobs)
        if len(jobs) != len(self._handles):
            raise InvalidJob(
                f"a middleware returned {len(jobs)} jobs for a workflow of {len(self._handles)}"
            )
        copy = Workflow(self.id)
        copy._after = dict(self._after)
        for handle, job in zip(self._handles.values(), jobs, strict=True):
            if not isinstance(job, Job) or job.idempotency_key is not None:
                raise InvalidJob("a middleware must return brooq.Job values without keys")
            copy._handles[handle.id] = replace(handle, job=job)
        return copy

    def nodes(self) -> list[Node]:
        """Every job with its parents, parents before children; InvalidJob for a cycle."""
        nodes = []
        for handle in self._handles.values():
            own = handle.job.after_ids
            listed = self._after[handle.id]
            merged = tuple(dict.fromkeys(listed + own))
            nodes.append(Node(handle.id, replace(handle.job, after=()), merged))
        return ordered(nodes)


def ordered(nodes: list[Node]) -> list[Node]:
    """``nodes`` with every node after its parents among them (a stable topological order);
    InvalidJob naming a job on a cycle, or an id given twice."""
    index = {n.id: i for i, n in enumerate(nodes)}
    if len(index) != len(nodes):
        raise InvalidJob("a workflow lists the same job twice")
    waiting_for = [sum(p in index for p in n.parents) for n in nodes]
    children: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for parent in node.parents:
            if parent in index:
                children.setdefault(parent, []).append(i)
    ready = [i for i, n in enumerate(waiting_for) if n == 0]
    heapq.heapify(ready)  # by the order of adding, so the order is stable
    out: list[Node] = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        out.append(node)
        for child in children.get(node.id, ()):
            waiting_for[child] -= 1
            if waiting_for[child] == 0:
                heapq.heappush(ready, child)
    if len(out) < len(nodes):
        stuck = next(n for i, n in enumerate(nodes) if waiting_for[i] > 0)
        raise InvalidJob(
            f"the workflow's jobs wait for each other in a cycle (job {stuck.id} is on one); "
            "nothing was written"
        )
    return out
