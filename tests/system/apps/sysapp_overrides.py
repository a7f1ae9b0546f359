"""Kinds with generous options, for jobs that override them (``Job(max_attempts=…)``)."""

from __future__ import annotations

import os
import time

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind(
    "flaky",
    max_attempts=5,
    attempt_timeout="50s",
    max_execution_timeout="60s",
    backoff_base="1s",
    backoff_max="1s",
)
def flaky(claim: brooq.Claim) -> None:
    """Sleep as long as the payload says (0 by default), then fail."""
    p = claim.payload if isinstance(claim.payload, dict) else {}
    time.sleep(float(p.get("sleep", 0)))
    raise RuntimeError(f"failed attempt {claim.attempt} of {claim.max_attempts}")
