"""Rate-limited kinds: every handler appends its start time to RATE_STARTS (one line a start).

``api.call`` starts at most 20 a second (burst 5) over every supervisor;
``tenant.call`` at most 2 a second per rate_key (burst 2, one interval's worth).
"""

from __future__ import annotations

import json
import os
import time

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])
STARTS = os.environ["RATE_STARTS"]


def record(claim: brooq.Claim, key: str | None) -> None:
    """One line, written with one O_APPEND write: lines of several processes never mix."""
    line = json.dumps({"t": time.time(), "id": claim.id, "key": key, "pid": os.getpid()})
    fd = os.open(STARTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@queue.kind("api.call", rate_limit="20/s", rate_burst=5)
def api_call(claim: brooq.Claim) -> None:
    """Record the start, then sleep as long as the payload says (``{"sleep": s}``; none)."""
    record(claim, None)
    if isinstance(claim.payload, dict):
        time.sleep(float(claim.payload.get("sleep", 0)))


@queue.kind("tenant.call", rate_limit="2/s")
def tenant_call(claim: brooq.Claim) -> None:
    """Record the start and the job's key (its payload repeats the rate_key)."""
    record(claim, str(claim.payload))
