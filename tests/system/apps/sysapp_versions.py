"""A kind whose result is the app version of the supervisor that ran it (rolling deploys)."""

from __future__ import annotations

import os
import time

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind("work")
def work(claim: brooq.Claim) -> str | None:
    """Sleep as the payload says, then name the version this supervisor claims as."""
    p = claim.payload if isinstance(claim.payload, dict) else {}
    time.sleep(float(p.get("sleep", 0.05)))
    return queue.app_version
