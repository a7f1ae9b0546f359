"""Keyless batches written with COPY: the bulk path of an enqueue.

A batch of at least `COPY_MIN_JOBS` jobs without idempotency keys and without
parents needs nothing an INSERT statement gives: no key to write or look up, no
edge, no row to read back (its ids are made here, as for the statements, and
every row is written or the COPY fails whole). So it is streamed with ``COPY job
(…) FROM STDIN`` (``copy_jobs``; ``copy_jobs_at`` when the jobs carry their own
``available_at``), then woken with one NOTIFY per topic (``notify_topics``), in
the caller's transaction, or in one of its own on an autocommit connection, so
that the rows and their NOTIFYs commit together or not at all. The statements
name their columns: every other one (state, attempts, the times, whatever a
later migration adds) takes its default. Through PgBouncer's transaction
pooling a COPY is one more statement of the transaction.

The rows go in COPY's text format, in one buffer. A batch of jobs that set only
their topic and payload, enqueued without an app version (most bulk batches), is
written as three columns (``copy_jobs_plain``): priority, rate_key and app_version
would be the columns' defaults (0, NULL, NULL) on every row, and leaving them out
saves the bytes and the server's parsing of them. Every job is checked and encoded
before the first byte is sent: a bad one stops the batch with nothing written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from brooq.postgres.sql import sql
from brooq.vocabulary import Enqueued, Job, new_job_ids
from brooq.vocabulary.job import plain_jobs
from brooq.vocabulary.payload import encode_payloads

COPY_MIN_JOBS = 64
"""The fewest jobs written with COPY: below, one INSERT statement (one round trip) is
faster than a COPY and its NOTIFY (three or four)."""
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
"""What COPY's text format escapes in a value (NUL never reaches here: Job refuses it)."""


def copyable(jobs: Sequence[Job]) -> bool:
    """True when ``jobs`` are written with COPY: enough of them, none with an idempotency key,
    parents, overrides of its kind's options or a trace context (columns COPY does not
    write), and either all or none with their own ``available_at`` (a job without one is
    ready at the database's ``now()``, which COPY's data cannot say)."""
    if len(jobs) < COPY_MIN_JOBS:
        return False
    if plain_jobs(jobs):
        return True  # the common batch, told at a glance
    delayed = jobs[0].available_at is not None
    return all(
        job.idempotency_key is None
        and not job.after
        and job.overrides is None
        and job.trace_context is None
        and (job.available_at is not None) == delayed
        for job in jobs
    )


class CopyBatch:
    """Jobs given ids and their payloads encoded (so checked, before anything is sent), and
    written as COPY's rows."""

    def __init__(
        self, jobs: Sequence[Job], max_payload_bytes: int, app_version: str | None = None
    ) -> None:
        self.jobs = jobs
        self.version = r"\N" if app_version is None else app_version  # needs no escape
        self.ids = new_job_ids(len(jobs))
        self.payloads = encode_payloads([job.payload for job in jobs], max_bytes=max_payload_bytes)
        self.delayed = jobs[0].available_at is not None
        self.plain = app_version is None and plain_jobs(jobs)
        self.topics = sorted({job.topic for job in jobs})

    @property
    def statement(self) -> str:
        """The COPY statement of these rows' columns."""
        if self.plain:
            return sql("copy_jobs_plain")
        return sql("copy_jobs_at") if self.delayed else sql("copy_jobs")

    def text(self) -> str:
        """The rows as COPY text: (id, payload, topic) when plain, else (id, payload, topic,
        priority, rate_key, app_version [, available_at])."""
        if not self.plain:
            return "".join(self._rows())
        rows = zip(self.ids, self.payloads, self.jobs, strict=True)
        text = "".join([f"{job_id}\t{payload}\t{job.topic}\n" for job_id, payload, job in rows])
        # JSON text holds no tab, newline or carriage return (the encoder writes them as
        # \t, \n, \r), and ids (hex) and topics ([a-z0-9_.-]) hold no backslash: doubling
        # every backslash of the buffer escapes exactly the payloads' ones.
        return text.replace("\\", "\\\\")

    def _rows(self) -> Iterator[str]:
        """The rows of every column, one at a time."""
        tails: dict[tuple[str, int, str | None], str] = {}  # a batch has few of them
        for job_id, payload, job in zip(self.ids, self.payloads, self.jobs, strict=True):
            if "\\" in payload:
                payload = payload.replace("\\", "\\\\")
            tail = tails.get(shared := (job.topic, job.priority, job.rate_key))
            if tail is None:
                tail = tails[shared] = f"{_tail(job)}\t{self.version}"
            if self.delayed:
                assert job.available_at is not None
                tail = f"{tail}\t{job.available_at.isoformat()}"
            yield f"{job_id}\t{payload}\t{tail}\n"

    def enqueued(self) -> list[Enqueued]:
        """One Enqueued per job, in order: each written, pending."""
        return Enqueued.pending(self.ids)


def _tail(job: Job) -> str:
    """The columns a job shares with most of its batch: topic, priority, rate_key."""
    rate_key = r"\N" if job.rate_key is None else job.rate_key.translate(_ESCAPES)
    return f"{job.topic}\t{job.priority}\t{rate_key}"


def _own_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when ``conn`` is autocommit outside a transaction: the COPY and its NOTIFYs
    need one of their own to commit together."""
    return conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def copy_on(conn: psycopg.Connection[Any], batch: CopyBatch, notify: bool) -> list[Enqueued]:
    """Write ``batch`` on ``conn`` with COPY, then its NOTIFYs (see the module)."""
    block = conn.transaction() if _own_transaction(conn) else contextlib.nullcontext()
    with block, conn.cursor() as cur:
        with cur.copy(batch.statement) as copy:
            copy.write(batch.text())
        if notify:
            cur.execute(sql("notify_topics"), {"topics": batch.topics})
    return batch.enqueued()


async def copy_on_async(
    aconn: psycopg.AsyncConnection[Any], batch: CopyBatch, notify: bool
) -> list[Enqueued]:
    """:func:`copy_on` for an asyncio connection."""
    own = _own_transaction(aconn)
    async with aconn.transaction() if own else contextlib.nullcontext(), aconn.cursor() as cur:
        async with cur.copy(batch.statement) as copy:
            await copy.write(batch.text())
        if notify:
            await cur.execute(sql("notify_topics"), {"topics": batch.topics})
    return batch.enqueued()
