"""A kind with a concurrency limit: ``report`` runs at most 3 at once across every supervisor."""

from __future__ import annotations

import os
import time

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind("report", max_running=3)
def report(claim: brooq.Claim) -> None:
    """Sleep as long as the payload says (0.3 s by default)."""
    p = claim.payload if isinstance(claim.payload, dict) else {}
    time.sleep(float(p.get("sleep", 0.3)))


@queue.kind("free")
def free(claim: brooq.Claim) -> None:
    """An unlimited kind served by the same workers."""
    p = claim.payload if isinstance(claim.payload, dict) else {}
    time.sleep(float(p.get("sleep", 0.05)))
