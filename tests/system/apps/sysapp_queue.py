"""The app of the worker-queue tests: every run is written down with its process and times.

Topic ``fast``; payload fields (all optional): ``trace`` (a folder: each run appends one JSON
line ``{"id", "pid", "attempt", "start", "end"}`` to a file named after its process),
``sleep`` (seconds; default 5 ms), ``crash`` (``os._exit(3)`` after the sleep).
"""

from __future__ import annotations

import json
import os
import time

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind("fast", max_attempts=3, backoff_base="10ms", backoff_max="10ms")
def fast(claim: brooq.Claim) -> None:
    """Sleep a little (or as told), write the run down, crash when told."""
    p = claim.payload if isinstance(claim.payload, dict) else {}
    start = time.time()
    time.sleep(float(p.get("sleep", 0.005)))
    if p.get("trace"):
        line = {"id": claim.id, "pid": os.getpid(), "attempt": claim.attempt}
        with open(os.path.join(p["trace"], str(os.getpid())), "a") as f:
            f.write(json.dumps({**line, "start": start, "end": time.time()}) + "\n")
    if p.get("crash"):
        os._exit(3)


@queue.kind("fail", max_attempts=1)
def fail(claim: brooq.Claim) -> None:
    """Always fails: its failure is logged whatever QUEUE_LOG_JOBS says."""
    raise RuntimeError("this one fails")
