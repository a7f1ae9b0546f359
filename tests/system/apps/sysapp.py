"""The app the system tests supervise: what a handler does is steered by its payload.

Payload fields (all optional; a payload that is not an object does nothing):

- ``sleep``: seconds to sleep, on every attempt; ``sleep_first``: only on attempt 1;
- ``loop``: seconds to spend in short ``time.sleep`` calls (interruptible);
- ``mark``: a file path; when an Interrupted arrives, its type and the time go there;
- ``record``: on success, insert the job id into table ``handled`` in the settle tx;
- ``crash``: ``"exit1"`` ends the process with ``os._exit(1)``;
- ``leak_mib``: keep that many MiB (touched, so resident) for the life of the process;
- ``hang``: ignore SIGALRM/SIGUSR1/SIGUSR2/SIGTERM and spin forever.

Kinds: ``work`` (defaults), ``poison`` (3 attempts, tiny backoff), ``hung``
(1 s attempt timeout, 1 s watchdog grace, 1 min backoff so a failure stays visible).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])

LEAKED: list[bytearray] = []
PAGE = 4096


def _record(claim: brooq.Claim) -> None:
    def insert(conn: Any) -> None:
        conn.execute("INSERT INTO handled (job_id) VALUES (%s)", (claim.id,))

    claim.on_succeeded(insert)


def _leak(mib: int) -> None:
    block = bytearray(mib * 1024 * 1024)
    for i in range(0, len(block), PAGE):
        block[i] = 1  # touch every page so it counts in RSS
    LEAKED.append(block)


def _hang() -> None:
    for signum in (signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    while True:
        pass


def _loop(seconds: float, mark: str | None) -> None:
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            time.sleep(0.05)
    except brooq.Interrupted as exc:
        if mark:
            with open(mark, "w") as f:
                f.write(f"{type(exc).__name__} {time.time()!r}")
        raise


def run(claim: brooq.Claim) -> None:
    """Do what the payload says."""
    p = claim.payload if isinstance(claim.payload, dict) else {}
    if p.get("record"):
        _record(claim)
    if p.get("crash") == "exit1":
        os._exit(1)
    if p.get("hang"):
        _hang()
    if p.get("leak_mib"):
        _leak(int(p["leak_mib"]))
    if p.get("sleep_first") and claim.attempt == 1:
        time.sleep(float(p["sleep_first"]))
    if p.get("sleep"):
        time.sleep(float(p["sleep"]))
    if p.get("loop"):
        _loop(float(p["loop"]), p.get("mark"))


queue.register("work", run)
queue.register("poison", run, max_attempts=3, backoff_base="20ms", backoff_max="50ms")
queue.register(
    "hung",
    run,
    attempt_timeout="1s",
    watchdog_grace="1s",
    max_attempts=3,
    backoff_base="1m",
    backoff_max="1m",
)
