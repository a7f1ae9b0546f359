"""The app of the promise tests (test_promises.py): handlers that kill their host, fail on cue,
and write down every run.

Payload fields (all optional):

- ``trace``: a file path; every run appends one JSON line (job id, charged attempt, expirations,
  pid, start time), and another with ``end`` when the handler returns or raises;
- ``hold_once``: a file path; the first run (the file does not exist yet) creates it and sleeps
  ``hold_s`` seconds (default 60), so the test can kill the host while the job runs;
- ``fail``: raise ``RuntimeError(fail)`` (after ``hold_once``, when the run did not hold);
- ``kill_host``: SIGKILL this worker's own supervisor (its parent), as a job that brings down
  its host would; the worker dies with it;
- ``loop``: seconds spent in short sleeps; ``record``: insert the job id into ``handled`` in the
  settle transaction.

Kinds: ``fragile`` (2 attempts, 2 s backoff so ``failed`` stays visible), ``host-killer``
(2 attempts), ``work`` (defaults).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


def _trace(path: str, claim: brooq.Claim, **more: Any) -> None:
    line = {
        "job_id": claim.id,
        "attempt": claim.attempt,
        "expirations": claim.expirations,
        "pid": os.getpid(),
        "at": time.time(),
        **more,
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def _record(claim: brooq.Claim) -> None:
    def insert(conn: Any) -> None:
        conn.execute("INSERT INTO handled (job_id) VALUES (%s)", (claim.id,))

    claim.on_succeeded(insert)


def _act(claim: brooq.Claim, p: dict[str, Any]) -> None:
    if p.get("record"):
        _record(claim)
    if p.get("kill_host"):
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)  # the worker dies with its supervisor
    hold = p.get("hold_once")
    if hold and not Path(hold).exists():
        Path(hold).touch()
        time.sleep(float(p.get("hold_s", 60)))
        return
    if p.get("fail"):
        raise RuntimeError(str(p["fail"]))
    if p.get("loop"):
        end = time.monotonic() + float(p["loop"])
        while time.monotonic() < end:
            time.sleep(0.05)


def run(claim: brooq.Claim) -> None:
    """Do what the payload says, tracing the run when asked."""
    p = claim.payload if isinstance(claim.payload, dict) else {}
    trace = p.get("trace")
    if trace:
        _trace(trace, claim)
    try:
        _act(claim, p)
    finally:
        if trace:
            _trace(trace, claim, end=True)


queue.register("work", run)
queue.register("fragile", run, max_attempts=2, backoff_base="2s", backoff_max="2s")
queue.register("host-killer", run, max_attempts=2, backoff_base="20ms", backoff_max="50ms")
