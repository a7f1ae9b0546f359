"""Waiting for a job's result: what its row says, and the loop that waits for it to end.

The stores give the two moving parts: ``get`` (one SELECT) and ``wait`` (until
something may have changed: a NOTIFY, a settle in the in-memory store, or a
poll interval). The decision is here, once, for both stores.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from brooq.vocabulary import JobCanceled, JobDead, JobRecord, ResultTimeout, State

POLL_S = 1.0
"""A waiter looks at the row at least this often, whatever it hears (a NOTIFY may be lost,
or not sent: a reaper's `dead`, an operator's cancel through SQL)."""

_NOT_YET = object()


def verdict(record: JobRecord) -> object:
    """The result of a ``done`` job; JobDead or JobCanceled for one that ended without
    success; a sentinel while it has not ended (pending, failed and retrying, processing)."""
    if record.state is State.DONE:
        return record.result
    if record.state is State.DEAD:
        raise JobDead(record.id, record.state, record.last_error)
    if record.state is State.CANCELED:
        raise JobCanceled(record.id, record.state, record.last_error)
    return _NOT_YET


def wait_for_result(
    job_id: str,
    get: Callable[[str], JobRecord],
    wait: Callable[[float], None],
    timeout: float | None,
    clock: Callable[[], float] = time.monotonic,
) -> object:
    """The result of ``job_id`` once it ended (see :func:`verdict`); ResultTimeout after
    ``timeout`` seconds (None: no limit); JobNotFound from ``get`` for an unknown id.
    ``wait(s)`` returns when the row may have changed, or after ``s`` seconds at most."""
    deadline = None if timeout is None else clock() + timeout
    while True:
        record = get(job_id)
        if (value := verdict(record)) is not _NOT_YET:
            return value
        left = POLL_S if deadline is None else min(POLL_S, deadline - clock())
        if left <= 0:
            raise ResultTimeout(record.id, record.state, float(timeout or 0))
        wait(left)


async def wait_for_result_async(
    job_id: str,
    get: Callable[[str], Awaitable[JobRecord]],
    wait: Callable[[float], Awaitable[None]],
    timeout: float | None,
    clock: Callable[[], float] = time.monotonic,
) -> object:
    """:func:`wait_for_result` for asyncio: ``get`` and ``wait`` are awaited."""
    deadline = None if timeout is None else clock() + timeout
    while True:
        record = await get(job_id)
        if (value := verdict(record)) is not _NOT_YET:
            return value
        left = POLL_S if deadline is None else min(POLL_S, deadline - clock())
        if left <= 0:
            raise ResultTimeout(record.id, record.state, float(timeout or 0))
        await wait(left)
