"""Handlers for tests/system/test_worker_edges.py (issue 32: the worker's sharp edges).

- ``frozen.sleep``: holds a lock file named for the job (``fcntl.flock``, never
  waiting) and sleeps ``seconds`` on its first run, 0.2 s on a run after a lease
  expired; every run appends JSON lines (start, end, and ``overlap`` when the
  lock was held by another run of the same job) to ``<dir>/trace``;
- ``frozen.stubborn``: the same, but it swallows every interrupt and sleeps on:
  only the end of its process stops it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import brooq

queue = brooq.Queue(os.environ["DATABASE_URL"])


def _trace(directory: str, claim: brooq.Claim, **more: Any) -> None:
    line = json.dumps(
        {
            "job_id": claim.id,
            "expirations": claim.expirations,
            "pid": os.getpid(),
            "at": time.time(),
            **more,
        }
    )
    fd = os.open(Path(directory) / "trace", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())  # one write with O_APPEND: never interleaved
    finally:
        os.close(fd)


@contextlib.contextmanager
def _only_run(directory: str, claim: brooq.Claim) -> Iterator[None]:
    """Hold the job's lock file; a run that finds it held writes down an overlap."""
    fd = os.open(Path(directory) / f"{claim.id}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _trace(directory, claim, overlap=True)
        _trace(directory, claim, start=True)
        try:
            yield
        finally:
            _trace(directory, claim, end=True)
    finally:
        os.close(fd)  # the lock goes with the descriptor (and with the process)


def _seconds(claim: brooq.Claim) -> float:
    return float(claim.payload["seconds"]) if claim.expirations == 0 else 0.2


def frozen_sleep(claim: brooq.Claim) -> None:
    """Sleep while holding the job's lock."""
    with _only_run(claim.payload["dir"], claim):
        time.sleep(_seconds(claim))


def frozen_stubborn(claim: brooq.Claim) -> None:
    """Sleep while holding the job's lock, and swallow every interrupt."""
    with _only_run(claim.payload["dir"], claim):
        end = time.monotonic() + _seconds(claim)
        while (left := end - time.monotonic()) > 0:
            try:
                time.sleep(left)
            except brooq.Interrupted:
                _trace(claim.payload["dir"], claim, swallowed=True)


queue.register("frozen.sleep", frozen_sleep, max_attempts=3)
queue.register("frozen.stubborn", frozen_stubborn, max_attempts=3)
