"""Handlers for tests/system/test_worker_edges.py (issue 32: the worker's sharp edges).

- ``frozen.sleep``: holds a lock file named for the job (``fcntl.flock``, never
  waiting) and sleeps ``seconds`` on its first run, 0.2 s on a run after a lease
  expired; every run appends JSON lines (start, end, and ``overlap`` when the
  lock was held by another run of the same job) to ``<dir>/trace``;
- ``frozen.stubborn``: the same, but it swallows every interrupt and sleeps on:
  only the end of its process stops it;
- ``wedge.effect``: succeeds with an ``on_succeeded`` hook (the worker opens its
  own connection to settle it);
- ``wedge.fork``: forks a process that starts a session of its own and forks a
  grandchild that ignores SIGTERM and sleeps (it keeps every descriptor of the
  worker, its database connection too); the grandchild's pid goes to the
  payload's ``pidfile``;
- ``wedge.exit``: succeeds with an ``on_succeeded`` hook that ends the worker
  (``os._exit(3)``) inside its settle transaction;
- ``wedge.idle``: succeeds with an ``on_succeeded`` hook that writes, then sleeps
  ``seconds`` inside the settle transaction, holding the job's row;
- ``wedge.gate``: waits (at most 60 s) for the file the payload's ``gate`` names;
- ``effect.backend``: succeeds with an ``on_succeeded`` hook that appends the
  backend pid of the worker's connection to the payload's ``file``;
- ``sleep``: sleeps the payload's ``seconds``;
- ``plain``: does nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
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


def wedge_effect(claim: brooq.Claim) -> None:
    """Succeed with an effect: the worker settles it on its own connection."""
    claim.on_succeeded(lambda conn: conn.execute("SELECT 1"))


def wedge_fork(claim: brooq.Claim) -> None:
    """Leave a grandchild in a session of its own that holds every descriptor the worker had."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setsid()
            inner = os.fork()
            if inner == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                os.close(write_end)
                time.sleep(600)
            else:
                os.write(write_end, str(inner).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe, open(claim.payload["pidfile"], "w") as f:
        f.write(pipe.read())
    os.waitpid(pid, 0)


def wedge_exit(claim: brooq.Claim) -> None:
    """Succeed with a hook that ends the worker in the middle of its settle transaction."""
    claim.on_succeeded(lambda conn: os._exit(3))


def wedge_idle(claim: brooq.Claim) -> None:
    """Succeed with a hook that holds the settle transaction open, idle."""
    seconds = float(claim.payload["seconds"])

    def hook(conn: Any) -> None:
        conn.execute("SELECT 1")
        time.sleep(seconds)

    claim.on_succeeded(hook)


def wedge_gate(claim: brooq.Claim) -> None:
    """Wait for the test to open the gate."""
    gate, deadline = Path(claim.payload["gate"]), time.monotonic() + 60
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def effect_backend(claim: brooq.Claim) -> None:
    """Succeed with a hook that writes down which backend settled the job."""

    def hook(conn: Any) -> None:
        (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()
        with open(claim.payload["file"], "a") as f:
            f.write(f"{pid}\n")

    claim.on_succeeded(hook)


def sleep(claim: brooq.Claim) -> None:
    """Sleep a while."""
    time.sleep(float(claim.payload["seconds"]))


def plain(claim: brooq.Claim) -> None:
    """Nothing."""


queue.register("frozen.sleep", frozen_sleep, max_attempts=3)
queue.register("frozen.stubborn", frozen_stubborn, max_attempts=3)
queue.register("wedge.effect", wedge_effect, max_attempts=3)
queue.register("wedge.fork", wedge_fork, max_attempts=1)
queue.register("wedge.exit", wedge_exit, max_attempts=1)
queue.register("wedge.idle", wedge_idle, max_attempts=1)
queue.register("wedge.gate", wedge_gate, max_attempts=3)
queue.register("effect.backend", effect_backend, max_attempts=3)
queue.register("sleep", sleep, max_attempts=3)
queue.register("plain", plain, max_attempts=20)
