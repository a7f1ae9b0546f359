"""The app of the stored-results tests: handlers that return something, or fail, or stall.

Kinds: ``sum`` returns ``{"sum": …}`` of its payload's numbers after ``sleep`` seconds (a
``big`` payload returns 2 MiB, over QUEUE_MAX_RESULT_BYTES=1MiB); ``boom`` always fails.
"""

from __future__ import annotations

import os
import time
from typing import Any

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind("sum", max_attempts=1)
def total(claim: brooq.Claim) -> Any:
    """Sum the payload's numbers (after its sleep), or return too much."""
    p = claim.payload or {}
    time.sleep(float(p.get("sleep", 0)))
    if p.get("big"):
        return "x" * (2 * 1024 * 1024)
    return {"sum": sum(p.get("numbers", []))}


@queue.kind("boom", max_attempts=1)
def boom(claim: brooq.Claim) -> None:
    """Always fails."""
    raise RuntimeError("boom")
