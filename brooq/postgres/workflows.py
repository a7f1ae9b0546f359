"""Workflows on PostgreSQL: jobs with parents enqueued with their edges, parents read back,
a workflow canceled, stranded edges resolved. The statements are in queries.sql; the
resolution of an edge when its parent ends lives in the statements that end jobs (the
``resolve_children`` fragment), not here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

from brooq.engine.edges import MISSING_PARENT_GRACE, Planned, enqueued_twice, outside, plan
from brooq.engine.inspection import Family, Relative
from brooq.engine.outcome import clean_reason
from brooq.postgres.connect import Connector
from brooq.postgres.enqueue import (
    Statement,
    Steps,
    control_fields,
    enqueue_steps,
    keys_of,
    run_steps,
)
from brooq.postgres.sql import sql
from brooq.postgres.upkeep import retrying
from brooq.vocabulary import (
    Enqueued,
    InvalidJob,
    Job,
    JobNotFound,
    Node,
    Parent,
    State,
    Workflow,
    decode_stored_payload,
    encode_payload,
    new_job_ids,
    parse_job_id,
)

Row = tuple[Any, ...]
FAMILY_LIMIT = 200
"""Parents and children listed by ``brooq job`` and the dashboard (each side; the totals
are always given)."""


def nodes_of(jobs: Sequence[Job]) -> list[Node]:
    """Jobs of a plain enqueue as nodes: fresh ids, their ``after`` as parents."""
    ids = new_job_ids(len(jobs))
    return [Node(i, job, job.after_ids) for i, job in zip(ids, jobs, strict=True)]


class GraphBatch:
    """Planned jobs and their edges, as ``enqueue_graph``'s parameters; keyed as
    brooq.postgres.enqueue keys a plain batch (:func:`enqueue_steps` runs both)."""

    def __init__(self, planned: list[Planned], max_payload_bytes: int) -> None:
        self.planned = planned
        self.jobs = [p.job for p in planned]
        self.ids = [p.id for p in planned]
        dumps = json.dumps
        self.rows = []
        for p in planned:
            job = p.job
            fields = {
                "id": p.id,
                "topic": job.topic,
                "key": job.idempotency_key,
                "at": job.available_at.isoformat() if job.available_at else None,
                "priority": job.priority,
                "rate_key": job.rate_key,
                "state": str(p.state),
                "workflow": p.workflow_id,
                "policy": p.policy,
                "parents_left": p.parents_left,
                "error": p.reason,
            }
            payload = encode_payload(job.payload, max_bytes=max_payload_bytes)
            self.rows.append(
                dumps(fields, ensure_ascii=False)[:-1]
                + f',"payload":{payload}{control_fields(job)}}}'
            )
        self.edges = dumps(
            [
                {"parent_id": parent, "child_id": p.id, "parent_state": end}
                for p in planned
                for parent, end in p.parents
            ]
        )

    def statement(self, which: Sequence[int], notify: bool) -> Statement:
        """``enqueue_graph`` for jobs ``which`` (an edge goes in with its child only)."""
        jobs = "[" + ",".join(self.rows[i] for i in which) + "]"
        return sql("enqueue_graph"), {"jobs": jobs, "edges": self.edges, "notify": notify}

    def key(self, i: int) -> tuple[str, str | None]:
        """Job ``i``'s (topic, idempotency_key)."""
        return self.jobs[i].topic, self.jobs[i].idempotency_key

    def keys_of(self, which: Sequence[int]) -> dict[str, list[str]]:
        """The (topic, key) pairs of jobs ``which``, as the key statements' two arrays."""
        return keys_of(map(self.key, which))

    def created_state(self, i: int) -> State:
        """As planned: waiting, pending, or canceled by its policy."""
        return self.planned[i].state


def graph_steps(
    nodes: Sequence[Node], workflow_id: str | None, notify: bool, max_payload_bytes: int
) -> Steps:
    """The steps of an enqueue of ``nodes`` (parents before children among them): their
    parents' states read, the jobs planned (brooq.engine.edges), then the keyed enqueue."""
    known: dict[str, State] = {}
    if ids := outside(nodes):
        rows = yield sql("parent_states"), {"ids": ids}
        known = {str(job_id): State(state) for job_id, state in rows}
    batch = GraphBatch(plan(nodes, known, workflow_id), max_payload_bytes)
    return (yield from enqueue_steps(batch, notify))


def enqueue_workflow_on(
    conn: psycopg.Connection[Any],
    workflow: Workflow,
    notify: bool,
    max_payload_bytes: int,
    app_version: str | None = None,
) -> list[Enqueued]:
    """Write ``workflow`` on ``conn``, in whatever transaction it has open; one Enqueued per
    job, in the order they were added, each stamped with ``app_version`` (so every child
    runs on the version of the code that enqueued it). InvalidJob when it was enqueued
    before."""
    nodes = workflow.nodes()
    try:
        steps = graph_steps(nodes, workflow.id, notify, max_payload_bytes)
        done = run_steps(conn, steps, app_version)
    except psycopg.errors.UniqueViolation as exc:
        # The primary key of job (of the partition that holds the id): its ids exist.
        table = exc.diag.table_name or ""
        if table.startswith("job") and table not in ("job_key", "job_edge"):
            raise enqueued_twice(workflow.id) from exc
        raise
    by_id = {n.id: e for n, e in zip(nodes, done, strict=True)}
    return [by_id[h.id] for h in workflow]


class PostgresWorkflows:
    """The workflows half of PostgresStore: what it adds to the Store port."""

    connector: Connector
    notify: bool
    max_payload_bytes: int
    app_version: str | None

    def enqueue_workflow(self, workflow: Workflow, conn: Any = None) -> list[Enqueued]:
        """Write the workflow's jobs and edges in one statement; in ``conn``'s transaction
        when given. One Enqueued per job, in the order they were added."""
        args = (workflow, self.notify, self.max_payload_bytes, self.app_version)
        if conn is not None:
            return enqueue_workflow_on(conn, *args)
        with self.connector.connection() as own:
            return enqueue_workflow_on(own, *args)

    def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> int:
        """Cancel every job of the workflow that has not ended, in one statement; how many."""
        try:
            key = parse_job_id(workflow_id)
        except ValueError as exc:
            raise InvalidJob(f"workflow id: {exc}") from None
        params = {"workflow": key, "reason": None if reason is None else clean_reason(reason)}
        return int(retrying(self.connector, sql("cancel_workflow"), params)[0][0])

    def parents(self, job_id: str) -> dict[str, Parent]:
        """What the job sees of its parents: id → Parent(state, result)."""
        try:
            key = parse_job_id(job_id)
        except ValueError as exc:
            raise JobNotFound(str(exc)) from None
        with self.connector.connection() as conn:
            return parents_on(conn, key)

    def resolve_stranded(self, batch: int = 1000) -> int:
        """The reaper's safety net for edges (queries.sql ``resolve_stranded``); how many."""
        params = {"batch": batch, "grace": MISSING_PARENT_GRACE}
        return int(retrying(self.connector, sql("resolve_stranded"), params)[0][0])


def parents_on(conn: psycopg.Connection[Any], job_id: str) -> dict[str, Parent]:
    """What ``job_id`` sees of its parents (the ``parents`` statement)."""
    out = {}
    for parent_id, state, result in conn.execute(sql("parents"), {"id": job_id}):
        value = None if result is None else decode_stored_payload(result)[0]
        out[str(parent_id)] = Parent(None if state is None else State(state), value)
    return out


def family_of(rows: Sequence[Row]) -> Family:
    """The Family of the ``family`` statement's rows."""
    sides: dict[str, list[Relative]] = {"parent": [], "child": []}
    totals = {"parent": 0, "child": 0}
    for side, job_id, state, total in rows:
        sides[side].append(Relative(str(job_id), None if state is None else State(state)))
        totals[side] = int(total)
    return Family(sides["parent"], sides["child"], totals["parent"], totals["child"])
