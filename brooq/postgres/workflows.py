"""Workflows on PostgreSQL: jobs with parents enqueued with their edges, parents read back,
a workflow canceled, stranded edges resolved. The statements are in queries.sql; the
resolution of an edge when its parent ends lives in the statements that end jobs (the
``resolve_children`` fragment), not here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

from brooq.engine.edges import Planned, enqueued_twice, outside, plan
from brooq.engine.inspection import Family, Relative
from brooq.postgres.sql import sql
from brooq.vocabulary import (
    EnqueueConflict,
    Enqueued,
    Job,
    Node,
    Parent,
    State,
    Workflow,
    decode_stored_payload,
    encode_payload,
    new_job_ids,
)

Row = tuple[Any, ...]
FAMILY_LIMIT = 200
"""Parents and children listed by ``brooq job`` and the dashboard (each side; the totals
are always given)."""


def nodes_of(jobs: Sequence[Job]) -> list[Node]:
    """Jobs of a plain enqueue as nodes: fresh ids, their ``after`` as parents."""
    ids = new_job_ids(len(jobs))
    return [Node(i, job, job.after_ids) for i, job in zip(ids, jobs, strict=True)]


def known_params(nodes: Sequence[Node]) -> dict[str, Any] | None:
    """The ``parent_states`` parameters: the parents outside ``nodes`` (None: there are none)."""
    ids = outside(nodes)
    return {"ids": ids} if ids else None


def known_states(rows: Sequence[Row]) -> dict[str, State]:
    """The states of the ``parent_states`` rows."""
    return {str(job_id): State(state) for job_id, state in rows}


class GraphBatch:
    """Planned jobs and their edges, as the parameters of ``enqueue_graph``."""

    def __init__(self, planned: list[Planned], max_payload_bytes: int, notify: bool) -> None:
        self.planned = planned
        dumps = json.dumps
        rows = []
        for p in planned:
            job = p.job
            fields = {
                "id": p.id,
                "topic": job.topic,
                "key": job.idempotency_key,
                "at": job.available_at.isoformat() if job.available_at else None,
                "priority": job.priority,
                "state": str(p.state),
                "workflow": p.workflow_id,
                "policy": p.policy,
                "parents_left": p.parents_left,
                "error": p.reason,
            }
            payload = encode_payload(job.payload, max_bytes=max_payload_bytes)
            rows.append(dumps(fields, ensure_ascii=False)[:-1] + f',"payload":{payload}}}')
        edges = [
            {"parent_id": parent, "child_id": p.id, "parent_state": end}
            for p in planned
            for parent, end in p.parents
        ]
        self.params = {"jobs": "[" + ",".join(rows) + "]", "edges": dumps(edges), "notify": notify}

    def missing_keys(self, inserted: set[str]) -> dict[str, list[str]] | None:
        """The ``existing_keys`` parameters for keyed jobs not inserted (None: there are none)."""
        held = [p.job for p in self.planned if p.id not in inserted and p.job.idempotency_key]
        if not held:
            return None
        return {"topics": [j.topic for j in held], "keys": [str(j.idempotency_key) for j in held]}

    def results(self, inserted: set[str], existing: Sequence[Row]) -> list[Enqueued]:
        """One Enqueued per planned job, in order: created (with its state), or the row that
        held its key."""
        held = {(t, k): (str(i), State(s)) for t, k, i, s in existing}
        out = []
        for p in self.planned:
            if p.id in inserted:
                out.append(Enqueued(p.id, True, p.state))
            elif (found := held.get((p.job.topic, p.job.idempotency_key))) is not None:
                out.append(Enqueued(found[0], False, found[1]))
            else:
                raise EnqueueConflict(
                    f"idempotency key {p.job.idempotency_key!r} of topic {p.job.topic!r} is "
                    "held by a row this transaction cannot see; retry the enqueue in a new "
                    "transaction"
                )
        return out


def enqueue_graph_on(
    conn: psycopg.Connection[Any],
    nodes: Sequence[Node],
    *,
    workflow_id: str | None = None,
    notify: bool = True,
    max_payload_bytes: int,
) -> list[Enqueued]:
    """Write ``nodes`` (parents before children among them) and their edges on ``conn``, in
    whatever transaction it has open: the parents' states read, the jobs planned, then one
    statement. One Enqueued per node, in order."""
    params = known_params(nodes)
    known = known_states(conn.execute(sql("parent_states"), params).fetchall()) if params else {}
    batch = GraphBatch(plan(nodes, known, workflow_id), max_payload_bytes, notify)
    try:
        inserted = {str(r[0]) for r in conn.execute(sql("enqueue_graph"), batch.params)}
    except psycopg.errors.UniqueViolation as exc:
        raise _duplicate(exc, workflow_id) from exc
    keys = batch.missing_keys(inserted)
    existing = conn.execute(sql("existing_keys"), keys).fetchall() if keys else []
    return batch.results(inserted, existing)


def enqueue_workflow_on(
    conn: psycopg.Connection[Any], workflow: Workflow, notify: bool, max_payload_bytes: int
) -> list[Enqueued]:
    """Write ``workflow`` on ``conn`` (:func:`enqueue_graph_on`); one Enqueued per job, in the
    order they were added."""
    nodes = workflow.nodes()
    done = enqueue_graph_on(
        conn, nodes, workflow_id=workflow.id, notify=notify, max_payload_bytes=max_payload_bytes
    )
    by_id = {n.id: e for n, e in zip(nodes, done, strict=True)}
    return [by_id[h.id] for h in workflow]


async def enqueue_graph_on_async(
    aconn: psycopg.AsyncConnection[Any],
    nodes: Sequence[Node],
    *,
    workflow_id: str | None = None,
    notify: bool = True,
    max_payload_bytes: int,
) -> list[Enqueued]:
    """:func:`enqueue_graph_on` for an asyncio connection."""
    known: dict[str, State] = {}
    if (params := known_params(nodes)) is not None:
        cur = await aconn.execute(sql("parent_states"), params)
        known = known_states(await cur.fetchall())
    batch = GraphBatch(plan(nodes, known, workflow_id), max_payload_bytes, notify)
    try:
        cur = await aconn.execute(sql("enqueue_graph"), batch.params)
    except psycopg.errors.UniqueViolation as exc:
        raise _duplicate(exc, workflow_id) from exc
    inserted = {str(r[0]) for r in await cur.fetchall()}
    existing: list[Row] = []
    if (keys := batch.missing_keys(inserted)) is not None:
        cur = await aconn.execute(sql("existing_keys"), keys)
        existing = await cur.fetchall()
    return batch.results(inserted, existing)


def _duplicate(exc: psycopg.errors.UniqueViolation, workflow_id: str | None) -> Exception:
    """A job id taken already: only a workflow's ids are chosen before the enqueue."""
    if workflow_id is not None and exc.diag.constraint_name == "job_pkey":
        return enqueued_twice(workflow_id)
    return exc


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
