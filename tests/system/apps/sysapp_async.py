"""An app with ``async def`` handlers, run by the supervisor's children."""

from __future__ import annotations

import asyncio
import os

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind("aio.ok")
async def ok(claim: brooq.Claim) -> None:
    """Awaits a little, then succeeds, recording its job in the settle transaction."""
    await asyncio.sleep(0.01)

    def insert(conn: object) -> None:
        conn.execute("INSERT INTO handled (job_id) VALUES (%s)", (claim.id,))  # type: ignore[attr-defined]

    claim.on_succeeded(insert)


@queue.kind("aio.slow", attempt_timeout="500ms", max_attempts=1)
async def slow(claim: brooq.Claim) -> None:
    """Awaits far past its attempt timeout: interrupted, recorded as a failure."""
    await asyncio.sleep(30)
