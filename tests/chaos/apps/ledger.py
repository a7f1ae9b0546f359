"""The chaos suite's app: an effects ledger whose handler is steered by its payload.

Every attempt appends to an at-least-once **side log** outside any
transaction (one file per process under ``$LEDGER_DIR``, one ``os.write``
per line: ``job_id attempt pid event unix_time``), and a successful attempt
writes its in-database **effect** in the settle transaction, through
``claim.on_succeeded``: one row of ``effect(job_id uuid PRIMARY KEY)``. The
side log may hold several runs of a job; the effect table must hold exactly
one row per ``done`` job and none for any other (promise 2).

Payload fields (all optional):

- ``do``: ``normal`` (default), ``raise`` (raise an exception), ``hang``
  (ignore every interrupt signal and never return: the watchdog kills the
  process after attempt_timeout + grace), ``selfkill`` (``os.kill(getpid(),
  SIGKILL)``), ``poison`` (raise on every attempt: the job must go ``dead``);
- ``times``: on how many first attempts ``raise``/``hang``/``selfkill``
  misbehave (default 1); later attempts succeed;
- ``ms``: milliseconds of work (sleep) before succeeding.

Side-log events: ``start`` (the handler began), then one of ``ok`` (it
returned), ``raise``/``poison``/``hang``/``selfkill`` (it misbehaved), and
``hook`` (the settle transaction ran the effect insert; it may still roll
back).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import brooq

queue = brooq.Queue(os.environ.get("DATABASE_URL", "postgresql:///ledger-unset"))

TOPIC = "ledger"
POISON_TOPIC = "ledger.poison"
MAX_ATTEMPTS = 20
POISON_MAX_ATTEMPTS = 3
ATTEMPT_TIMEOUT_S = 1.0
BEHAVIOURS = ("normal", "raise", "hang", "selfkill", "poison")

_side_fd: dict[int, int] = {}


def side(job_id: str, attempt: int, what: str) -> None:
    """Append one line to this process's side log (no transaction: at least once)."""
    directory = os.environ.get("LEDGER_DIR")
    if not directory:
        return
    pid = os.getpid()
    fd = _side_fd.get(pid)
    if fd is None:
        path = os.path.join(directory, f"side-{pid}.log")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _side_fd.clear()
        _side_fd[pid] = fd
    os.write(fd, f"{job_id} {attempt} {pid} {what} {time.time():.3f}\n".encode())


def _effect(claim: brooq.Claim) -> None:
    def insert(conn: Any) -> None:
        side(claim.id, claim.attempt, "hook")
        conn.execute("INSERT INTO effect (job_id) VALUES (%s)", (claim.id,))

    claim.on_succeeded(insert)


def _hang() -> None:
    # Deaf to every interrupt brooq sends (timeout, lease lost, cancel, TERM):
    # only the supervisor's SIGKILL ends this. It sleeps rather than burning a
    # core, which on a 2-core CI box would slow every other process down.
    for signum in (signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    while True:
        time.sleep(0.02)


def run(claim: brooq.Claim) -> None:
    """Do what the payload says; log every step to the side log."""
    p = claim.payload if isinstance(claim.payload, dict) else {}
    do = str(p.get("do", "normal"))
    side(claim.id, claim.attempt, "start")
    if do == "poison" or (do != "normal" and claim.attempt <= int(p.get("times", 1))):
        side(claim.id, claim.attempt, do)
        if do == "selfkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if do == "hang":
            _hang()
        raise RuntimeError(f"ledger: {do} on attempt {claim.attempt}")
    if p.get("ms"):
        time.sleep(float(p["ms"]) / 1000)
    _effect(claim)
    side(claim.id, claim.attempt, "ok")


queue.register(
    TOPIC,
    run,
    max_attempts=MAX_ATTEMPTS,
    attempt_timeout=ATTEMPT_TIMEOUT_S,
    backoff_base="10ms",
    backoff_max="100ms",
)
queue.register(
    POISON_TOPIC,
    run,
    max_attempts=POISON_MAX_ATTEMPTS,
    attempt_timeout=ATTEMPT_TIMEOUT_S,
    backoff_base="10ms",
    backoff_max="50ms",
)
