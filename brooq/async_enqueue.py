"""``brooq.enqueue_async``: one job on an asyncio connection, without a Queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from brooq.postgres.enqueue import enqueue_on_async
from brooq.vocabulary import DEFAULT_MAX_PAYLOAD_BYTES, Enqueued, Job
from brooq.vocabulary.versions import default_app_version

if TYPE_CHECKING:  # psycopg itself stays in postgres/
    import psycopg


async def enqueue_async(
    aconn: psycopg.AsyncConnection[Any],
    job: Job,
    *,
    notify: bool = True,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    app_version: str | None = None,
) -> Enqueued:
    """Enqueue one job on an asyncio connection, inside its open transaction (no queue:
    no middleware; ``queue.enqueue_async`` goes through the queue's), stamped with
    ``app_version`` (as ``Queue(app_version=…)``)."""
    version = default_app_version(app_version)
    return (
        await enqueue_on_async(
            aconn, [job], notify=notify, max_payload_bytes=max_payload_bytes, app_version=version
        )
    )[0]
