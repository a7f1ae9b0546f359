"""Enqueue on a psycopg connection, inside whatever transaction it has open."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from brooq.postgres.sql import sql
from brooq.vocabulary import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    EnqueueConflict,
    Enqueued,
    Job,
    State,
    encode_payload,
    new_job_ids,
)

Row = tuple[Any, ...]


class PreparedBatch:
    """Jobs encoded and given ids, ready for one enqueue statement."""

    def __init__(self, jobs: Sequence[Job], max_payload_bytes: int) -> None:
        self.jobs = list(jobs)
        self.ids = new_job_ids(len(self.jobs))
        self.payloads = [encode_payload(j.payload, max_bytes=max_payload_bytes) for j in self.jobs]

    def params_one(self, notify: bool) -> dict[str, Any]:
        """Parameters of ``enqueue_one`` for a batch of one."""
        job = self.jobs[0]
        return {
            "id": self.ids[0],
            "topic": job.topic,
            "payload": self.payloads[0],
            "key": job.idempotency_key,
            "available_at": job.available_at,
            "priority": job.priority,
            "rate_key": job.rate_key,
            "notify": notify,
        }

    def params_many(self, notify: bool) -> dict[str, Any]:
        """Parameters of ``enqueue_many``: the jobs as one JSON array (payloads spliced in)."""
        dumps = json.dumps
        topics: dict[str, str] = {}  # a batch has few topics: encode each once
        rows = [
            f'{{"id":"{job_id}","topic":'
            f"{topics.get(job.topic) or topics.setdefault(job.topic, dumps(job.topic))},"
            f'"payload":{payload},'
            f'"key":{"null" if job.idempotency_key is None else dumps(job.idempotency_key)},'
            f'"at":{dumps(job.available_at.isoformat()) if job.available_at else "null"},'
            f'"priority":{job.priority}{_rate_key_field(job)}}}'
            for job_id, job, payload in zip(self.ids, self.jobs, self.payloads, strict=True)
        ]
        return {"jobs": "[" + ",".join(rows) + "]", "notify": notify}

    def statement(self) -> str:
        """The enqueue statement fitting this batch."""
        return sql("enqueue_one") if len(self.jobs) == 1 else sql("enqueue_many")

    def params(self, notify: bool) -> dict[str, Any]:
        """The parameters of :meth:`statement`."""
        return self.params_one(notify) if len(self.jobs) == 1 else self.params_many(notify)

    def missing_keys(self, inserted: set[str]) -> dict[str, list[str]]:
        """The (topic, key) pairs of jobs that were not inserted."""
        topics, keys = [], []
        for job_id, job in zip(self.ids, self.jobs, strict=True):
            if job_id not in inserted and job.idempotency_key is not None:
                topics.append(job.topic)
                keys.append(job.idempotency_key)
        return {"topics": topics, "keys": keys}

    def results(self, inserted: set[str], existing: Iterable[Row]) -> list[Enqueued]:
        """One Enqueued per job, in order: created, or the id of the row that held the key."""
        held = {(topic, key): (str(job_id), State(state)) for topic, key, job_id, state in existing}
        out = []
        for job_id, job in zip(self.ids, self.jobs, strict=True):
            if job_id in inserted:
                out.append(Enqueued(job_id, True))
            elif (found := held.get((job.topic, job.idempotency_key))) is not None:
                out.append(Enqueued(found[0], False, found[1]))
            else:
                raise EnqueueConflict(
                    f"idempotency key {job.idempotency_key!r} of topic {job.topic!r} is held by a "
                    "row this transaction cannot see (a concurrent or REPEATABLE READ "
                    "transaction); retry the enqueue in a new transaction"
                )
        return out


def _rate_key_field(job: Job) -> str:
    """The job's rate_key as a field of its JSON object (none when it has no key)."""
    return "" if job.rate_key is None else f',"rate_key":{json.dumps(job.rate_key)}'


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
) -> list[Enqueued]:
    """Enqueue ``jobs`` on ``conn``, inside whatever transaction it has open.

    Nothing is committed here: the jobs become visible when the caller commits
    and vanish if it rolls back.
    """
    if not jobs:
        return []
    batch = PreparedBatch(jobs, max_payload_bytes)
    try:
        inserted = {str(r[0]) for r in conn.execute(batch.statement(), batch.params(notify))}
    except psycopg.errors.SerializationFailure as exc:
        raise _conflict() from exc
    existing: list[Row] = []
    if len(inserted) < len(batch.jobs):
        existing = conn.execute(sql("existing_keys"), batch.missing_keys(inserted)).fetchall()
    return batch.results(inserted, existing)


async def enqueue_on_async(
    aconn: psycopg.AsyncConnection[Any],
    jobs: Sequence[Job],
    *,
    notify: bool = True,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> list[Enqueued]:
    """:func:`enqueue_on` for an asyncio connection."""
    if not jobs:
        return []
    batch = PreparedBatch(jobs, max_payload_bytes)
    try:
        cur = await aconn.execute(batch.statement(), batch.params(notify))
    except psycopg.errors.SerializationFailure as exc:
        raise _conflict() from exc
    inserted = {str(r[0]) for r in await cur.fetchall()}
    existing: list[Row] = []
    if len(inserted) < len(batch.jobs):
        cur = await aconn.execute(sql("existing_keys"), batch.missing_keys(inserted))
        existing = await cur.fetchall()
    return batch.results(inserted, existing)
