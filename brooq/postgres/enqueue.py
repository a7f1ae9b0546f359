"""Enqueue on a psycopg connection, inside whatever transaction it has open.

Idempotency keys live in ``job_key`` (the partitioned ``job`` cannot hold a
unique index on them): the enqueue statement writes a job's key and the job
together, and a duplicate comes back with the id and state of the job that
holds the key. :func:`enqueue_steps` says which statements an enqueue runs,
whatever runs them (:func:`enqueue_on`, :func:`enqueue_on_async`). Jobs with
parents (``after``) and workflows take the same steps, after reading their
parents' states (brooq.postgres.workflows).
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from datetime import timedelta
from typing import Any, Protocol

import psycopg

from brooq.postgres.behind import on_callers_connection
from brooq.postgres.bulk import CopyBatch, copy_on, copy_on_async, copyable
from brooq.postgres.sql import sql
from brooq.vocabulary import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    JOB_OVERRIDES,
    EnqueueConflict,
    Enqueued,
    Job,
    State,
    encode_payload,
    new_job_ids,
)

Row = tuple[Any, ...]
Statement = tuple[str, dict[str, Any]]
Steps = Generator[Statement, list[Row], list[Enqueued]]

KEY_ROUNDS = 3
"""How many times an enqueue tries again for keys freed while it ran (a dropped
partition, an orphan key): more would mean keys flapping, which is an error."""


class Batch(Protocol):
    """What :func:`enqueue_steps` enqueues: jobs with ids, their statements, their keys."""

    jobs: list[Job]
    ids: list[str]

    def statement(self, which: Sequence[int], notify: bool) -> Statement:
        """The enqueue statement for jobs ``which``, and its parameters."""
        ...

    def key(self, i: int) -> tuple[str, str | None]:
        """Job ``i``'s (topic, idempotency_key)."""
        ...

    def keys_of(self, which: Sequence[int]) -> dict[str, list[str]]:
        """The (topic, key) pairs of jobs ``which``, as the key statements' two arrays."""
        ...

    def created_state(self, i: int) -> State:
        """The state job ``i`` is written in."""
        ...


class PreparedBatch:
    """Jobs encoded and given ids, ready for the enqueue statements."""

    def __init__(self, jobs: Sequence[Job], max_payload_bytes: int) -> None:
        self.jobs = list(jobs)
        self.ids = new_job_ids(len(self.jobs))
        self.payloads = [encode_payload(j.payload, max_bytes=max_payload_bytes) for j in self.jobs]

    def params_one(self, i: int, notify: bool) -> dict[str, Any]:
        """Parameters of ``enqueue_one`` for job ``i``."""
        job = self.jobs[i]
        return {
            "id": self.ids[i],
            "topic": job.topic,
            "payload": self.payloads[i],
            "key": job.idempotency_key,
            "available_at": job.available_at,
            "priority": job.priority,
            "rate_key": job.rate_key,
            "notify": notify,
            **control_params(job),
        }

    def params_many(self, which: Sequence[int], notify: bool) -> dict[str, Any]:
        """Parameters of ``enqueue_many``: jobs ``which`` as one JSON array, payloads spliced in."""
        dumps = json.dumps
        topics: dict[str, str] = {}  # a batch has few topics: encode each once
        rows = []
        for i in which:
            job = self.jobs[i]
            topic = topics.get(job.topic) or topics.setdefault(job.topic, dumps(job.topic))
            key = "null" if job.idempotency_key is None else dumps(job.idempotency_key)
            at = dumps(job.available_at.isoformat()) if job.available_at else "null"
            rows.append(
                f'{{"id":"{self.ids[i]}","topic":{topic},"payload":{self.payloads[i]},'
                f'"key":{key},"at":{at},"priority":{job.priority}{_rate_key_field(job)}'
                f"{control_fields(job)}}}"
            )
        return {"jobs": "[" + ",".join(rows) + "]", "notify": notify}

    def statement(self, which: Sequence[int], notify: bool) -> Statement:
        """The enqueue statement for jobs ``which``, and its parameters (the keyless
        variants when no job of ``which`` has an idempotency key: they read nothing)."""
        keyless = all(self.jobs[i].idempotency_key is None for i in which)
        if len(which) == 1:
            name = "enqueue_one_keyless" if keyless else "enqueue_one"
            return sql(name), self.params_one(which[0], notify)
        name = "enqueue_many_keyless" if keyless else "enqueue_many"
        return sql(name), self.params_many(which, notify)

    def key(self, i: int) -> tuple[str, str | None]:
        """Job ``i``'s (topic, idempotency_key)."""
        return self.jobs[i].topic, self.jobs[i].idempotency_key

    def keys_of(self, which: Sequence[int]) -> dict[str, list[str]]:
        """The (topic, key) pairs of jobs ``which``, as the two arrays the key statements take."""
        return keys_of(map(self.key, which))

    def created_state(self, i: int) -> State:
        """A job without parents is written pending."""
        return State.PENDING


def keys_of(pairs: Any) -> dict[str, list[str]]:
    """(topic, key) pairs (keyless ones skipped) as the two arrays the key statements take."""
    found = sorted({(t, k) for t, k in pairs if k is not None})
    return {"topics": [t for t, _ in found], "keys": [k for _, k in found]}


def _held(rows: list[Row]) -> dict[tuple[str, str], tuple[str, str | None]]:
    """(topic, key) → (id, state) of the rows of a statement ending in ``held_keys``."""
    return {(r[2], r[3]): (str(r[0]), r[4]) for r in rows if not r[1]}


def enqueue_steps(batch: Batch, notify: bool) -> Steps:
    """The statements of one enqueue: send each one's rows back; returns one Enqueued per job.

    First the enqueue statement. A job it neither inserted nor found the holder of
    (a key taken by a transaction that committed meanwhile, or a duplicate inside
    the batch) is asked for again (``existing_keys``). A key whose job is gone is
    freed (``free_orphan_keys``), and the jobs whose key was freed meanwhile are
    enqueued again, at most KEY_ROUNDS times.
    """
    results: dict[int, Enqueued] = {}
    todo = list(range(len(batch.jobs)))
    for _ in range(KEY_ROUNDS):
        rows = yield batch.statement(todo, notify)
        created = {str(r[0]) for r in rows if r[1]}
        todo = _settle(batch, todo, created, _held(rows), results)
        if todo:
            found = _held((yield sql("existing_keys"), batch.keys_of(todo)))
            todo = _settle(batch, todo, set(), found, results)
            orphans = [i for i in todo if batch.key(i) in found]  # held, by no job
            if orphans:
                yield sql("free_orphan_keys"), batch.keys_of(orphans)
        if not todo:
            return [results[i] for i in range(len(batch.jobs))]
    job = batch.jobs[todo[0]]
    raise EnqueueConflict(
        f"idempotency key {job.idempotency_key!r} of topic {job.topic!r} is held by a row this "
        "transaction cannot see (a concurrent or REPEATABLE READ transaction), or was freed "
        "and taken again while this enqueue ran; retry the enqueue in a new transaction"
    )


def _settle(
    batch: Batch,
    which: list[int],
    created: set[str],
    held: dict[tuple[str, str], tuple[str, str | None]],
    results: dict[int, Enqueued],
) -> list[int]:
    """Record the result of each job of ``which`` the rows decide; the others, in order."""
    missing = []
    for i in which:
        job_id = batch.ids[i]
        found = held.get(batch.key(i))  # type: ignore[arg-type]
        if job_id in created:
            results[i] = Enqueued(job_id, True, batch.created_state(i))
        elif found is not None and found[1] is not None:
            results[i] = Enqueued(found[0], False, State(found[1]))
        else:
            missing.append(i)
    return missing


def _rate_key_field(job: Job) -> str:
    """The job's rate_key as a field of its JSON object (none when it has no key)."""
    return "" if job.rate_key is None else f',"rate_key":{json.dumps(job.rate_key)}'


_US = timedelta(microseconds=1)


def control_params(job: Job) -> dict[str, Any]:
    """The job's overrides and trace context as one statement's named parameters."""
    trace = job.trace_context
    return {
        "max_attempts": job.max_attempts,
        "attempt_timeout": job.attempt_timeout,
        "max_execution_timeout": job.max_execution_timeout,
        "backoff_base": job.backoff_base,
        "backoff_max": job.backoff_max,
        "trace_context": None if trace is None else json.dumps(trace, ensure_ascii=False),
    }


def control_fields(job: Job) -> str:
    """The job's overrides and trace context as fields of its JSON input object (none for a
    job that has neither: most jobs). Durations go as exact microseconds."""
    if job.overrides is None and job.trace_context is None:
        return ""
    out = ""
    for name in JOB_OVERRIDES:
        value = getattr(job, name)
        if isinstance(value, timedelta):
            out += f',"{name}":"{value // _US} microseconds"'
        elif value is not None:
            out += f',"{name}":{int(value)}'
    if job.trace_context is not None:
        out += f',"trace_context":{json.dumps(job.trace_context, ensure_ascii=False)}'
    return out


def steps_for(jobs: Sequence[Job], notify: bool, max_payload_bytes: int) -> Steps:
    """The steps of an enqueue of ``jobs``: with their parents' states first when some
    have parents."""
    if any(job.after_ids for job in jobs):
        from brooq.postgres.workflows import graph_steps, nodes_of  # it builds on this module

        return graph_steps(nodes_of(jobs), None, notify, max_payload_bytes)
    return enqueue_steps(PreparedBatch(jobs, max_payload_bytes), notify)


def versioned(params: Any, app_version: str | None) -> Any:
    """An enqueue statement's parameters with the version its jobs are stamped with (one
    for the whole statement: the enqueuer's). Statements that write no job ignore it."""
    return {**params, "app_version": app_version}


def _conflict() -> EnqueueConflict:
    return EnqueueConflict(
        "an idempotency key of this enqueue was taken by a transaction that committed "
        "after yours began (REPEATABLE READ or SERIALIZABLE); retry your whole transaction"
    )


def enqueue_on(
    conn: psycopg.Connection[Any],
    jobs: Sequence[Job],
    *,
    notify: bool = True,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    app_version: str | None = None,
) -> list[Enqueued]:
    """Enqueue ``jobs`` on ``conn``, inside whatever transaction it has open, each stamped
    with ``app_version`` (the enqueuer's; None: unversioned, claimed by every supervisor).

    Nothing is committed here: the jobs (and their keys) become visible when
    the caller commits and vanish if it rolls back. A large keyless batch is
    written with COPY (brooq.postgres.bulk).
    """
    if not jobs:
        return []
    if copyable(jobs):
        return copy_on(conn, CopyBatch(jobs, max_payload_bytes, app_version), notify)
    return run_steps(conn, steps_for(jobs, notify, max_payload_bytes), app_version)


def run_steps(
    conn: psycopg.Connection[Any], steps: Steps, app_version: str | None = None
) -> list[Enqueued]:
    """Run an enqueue's statements on ``conn``, in whatever transaction it has open; the
    jobs written carry ``app_version``."""
    try:
        statement, params = next(steps)
        while True:
            cur = conn.execute(statement, versioned(params, app_version))
            rows = cur.fetchall() if cur.description is not None else []
            statement, params = steps.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except psycopg.errors.SerializationFailure as exc:
        raise _conflict() from exc


async def enqueue_on_async(
    aconn: psycopg.AsyncConnection[Any],
    jobs: Sequence[Job],
    *,
    notify: bool = True,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    app_version: str | None = None,
) -> list[Enqueued]:
    """:func:`enqueue_on` for an asyncio connection."""
    if not jobs:
        return []
    if copyable(jobs):
        batch = CopyBatch(jobs, max_payload_bytes, app_version)
        return await copy_on_async(aconn, batch, notify)
    steps = steps_for(jobs, notify, max_payload_bytes)
    try:
        statement, params = next(steps)
        while True:
            with on_callers_connection():  # always the caller's: its app's asyncio connection
                cur = await aconn.execute(statement, versioned(params, app_version))
                rows = await cur.fetchall() if cur.description is not None else []
            statement, params = steps.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except psycopg.errors.SerializationFailure as exc:
        raise _conflict() from exc
