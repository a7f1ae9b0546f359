"""The app of the pause tests: every job appends ``start <id> <topic> <time>`` to the file
$PAUSE_LOG when its handler starts, sleeps ``payload["sleep"]`` seconds, then appends
``end <id> …``. Kinds ``pause.slow`` and ``pause.other``."""

from __future__ import annotations

import os
import time

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


def _note(what: str, claim: brooq.Claim) -> None:
    # One short write in append mode: lines of several workers never interleave.
    with open(os.environ["PAUSE_LOG"], "a") as log:
        log.write(f"{what} {claim.id} {claim.topic} {time.time():.6f}\n")


def run(claim: brooq.Claim) -> None:
    """Note the start, sleep as the payload says, note the end."""
    _note("start", claim)
    time.sleep(float((claim.payload or {}).get("sleep", 0)))
    _note("end", claim)


queue.register("pause.slow", run)
queue.register("pause.other", run)
