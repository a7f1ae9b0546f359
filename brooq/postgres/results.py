"""Waiting for a job's result on PostgreSQL: the process's one listener per DSN hears
brooq_done (one NOTIFY per settle statement that ended jobs) and brooq_cancel and wakes the
waiters (brooq.postgres.waiters), which read their rows through the store's connection;
polling where LISTEN cannot be had (a transaction-pooling bouncer without
QUEUE_LISTEN_URL). A waiter never holds a connection, let alone one idle in a transaction."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from brooq.engine.results import wait_for_result, wait_for_result_async
from brooq.postgres.waiters import shared_listener
from brooq.vocabulary import JobNotFound, JobRecord, parse_job_id


def job_key(job_id: str) -> str:
    """The job id as stored; JobNotFound for what cannot be one."""
    try:
        return parse_job_id(job_id)
    except ValueError as exc:
        raise JobNotFound(str(exc)) from None


def wait_listening(
    listen_dsn: str,
    pooled: bool,
    get: Callable[[str], JobRecord],
    job_id: str,
    timeout: float | None,
) -> object:
    """Wait for the process's shared listener on ``listen_dsn`` to hear something, reading
    the row with ``get`` (the store's connection): no connection of the waiter's own.
    ``pooled``: ``listen_dsn`` is the store's own DSN (see brooq.postgres.listen)."""
    key = job_key(job_id)
    with shared_listener(listen_dsn, pooled).waiting() as wait:
        return wait_for_result(key, get, wait, timeout)


def wait_polling(get: Callable[[str], JobRecord], job_id: str, timeout: float | None) -> object:
    """Wait by reading the row every POLL_S (no LISTEN to be had)."""
    return wait_for_result(job_key(job_id), get, time.sleep, timeout)


async def wait_listening_async(
    listen_dsn: str,
    pooled: bool,
    get: Callable[[str], JobRecord],
    job_id: str,
    timeout: float | None,
) -> object:
    """:func:`wait_listening` for asyncio: ``get`` runs in a thread, the loop never blocks."""
    key = job_key(job_id)

    async def read(k: str) -> JobRecord:
        return await asyncio.to_thread(get, k)

    async with shared_listener(listen_dsn, pooled).waiting_async() as wait:
        return await wait_for_result_async(key, read, wait, timeout)
