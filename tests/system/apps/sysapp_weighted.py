"""Two topics for weighted workers (``--workers t.a=2,t.b=1``)."""

from __future__ import annotations

import os
import time

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


def run(claim: brooq.Claim) -> None:
    """Sleep as long as the payload says."""
    p = claim.payload if isinstance(claim.payload, dict) else {}
    time.sleep(float(p.get("sleep", 0)))


queue.register("t.a", run)
queue.register("t.b", run)
