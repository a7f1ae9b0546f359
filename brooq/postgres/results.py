"""Waiting for a job's result on PostgreSQL: LISTEN brooq_done (one NOTIFY per settle
statement that ended jobs) and brooq_cancel, on an autocommit connection of the waiter's own,
which also reads the row; polling where LISTEN cannot be had (a transaction-pooling bouncer
without QUEUE_LISTEN_URL). A waiter never holds a connection idle in a transaction."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from brooq.engine.results import wait_for_result, wait_for_result_async
from brooq.postgres.connect import check_conninfo, connect, resilient, unavailable
from brooq.postgres.rows import record
from brooq.postgres.sql import sql
from brooq.vocabulary import JobNotFound, JobRecord, parse_job_id


def job_key(job_id: str) -> str:
    """The job id as stored; JobNotFound for what cannot be one."""
    try:
        return parse_job_id(job_id)
    except ValueError as exc:
        raise JobNotFound(str(exc)) from None


def _read(conn: psycopg.Connection[Any], job_id: str) -> JobRecord:
    row = conn.cursor(row_factory=dict_row).execute(sql("get"), {"id": job_id}).fetchone()
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    return record(row)


def wait_listening(listen_dsn: str, job_id: str, timeout: float | None) -> object:
    """Wait on a connection of its own that LISTENs and reads the row."""
    key = job_key(job_id)
    conn = connect(listen_dsn)
    try:
        for name in ("listen_done", "listen_cancels"):
            conn.execute(sql(name))

        def wait(seconds: float) -> None:
            for _ in conn.notifies(timeout=seconds, stop_after=1):
                pass
            for _ in conn.notifies(timeout=0):  # what else arrived: one look covers it all
                pass

        return wait_for_result(key, lambda k: _read(conn, k), wait, timeout)
    except psycopg.OperationalError as exc:
        raise unavailable(exc, listen_dsn) from None
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.close()


def wait_polling(get: Callable[[str], JobRecord], job_id: str, timeout: float | None) -> object:
    """Wait by reading the row every POLL_S (no LISTEN to be had)."""
    return wait_for_result(job_key(job_id), get, time.sleep, timeout)


async def wait_listening_async(listen_dsn: str, job_id: str, timeout: float | None) -> object:
    """:func:`wait_listening` on an asyncio connection."""
    key = job_key(job_id)
    check_conninfo(listen_dsn)
    try:
        conn = await psycopg.AsyncConnection.connect(
            listen_dsn, autocommit=True, **resilient(listen_dsn)
        )
    except psycopg.Error as exc:
        raise unavailable(exc, listen_dsn) from None
    try:
        for name in ("listen_done", "listen_cancels"):
            await conn.execute(sql(name))

        async def get(k: str) -> JobRecord:
            cur = conn.cursor(row_factory=dict_row)
            row = await (await cur.execute(sql("get"), {"id": k})).fetchone()
            if row is None:
                raise JobNotFound(f"no job with id {k}")
            return record(row)

        async def wait(seconds: float) -> None:
            async for _ in conn.notifies(timeout=seconds, stop_after=1):
                pass

        return await wait_for_result_async(key, get, wait, timeout)
    except psycopg.OperationalError as exc:
        raise unavailable(exc, listen_dsn) from None
    finally:
        with contextlib.suppress(psycopg.Error):
            await conn.close()
