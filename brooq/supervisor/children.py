"""The parent's view of its worker processes: who runs what, and until when it may."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from enum import StrEnum

from brooq.engine.store import Claimed
from brooq.supervisor import protocol
from brooq.supervisor.producer import Group


class Interrupt(StrEnum):
    """Why a running handler was interrupted (the exception raised into it)."""

    ATTEMPT_TIMEOUT = "attempt_timeout"
    LEASE_LOST = "lease_lost"
    CANCELED = "canceled"


class Kill(StrEnum):
    """Why the parent SIGKILLed a worker."""

    HUNG = "hung"
    """An interrupted handler did not exit within its grace."""
    MAX_EXECUTION = "max_execution"
    LEASE_ENDING = "lease_ending"
    """Heartbeats failed and the lease is about to end: the job must not run twice."""
    BROKEN = "broken"
    """The worker closed its connection to the parent or wrote garbage on it."""
    SHUTDOWN = "shutdown"


class Exit(StrEnum):
    """Why a worker is gone: the ``reason`` of WorkerExited and brooq_worker_restarts_total."""

    STOPPED = "stopped"
    CRASH = "crash"
    HUNG = "hung"
    MAX_EXECUTION = "max_execution"
    LEASE_ENDING = "lease_ending"
    BROKEN = "broken"
    MAX_JOBS = "max_jobs"
    MAX_MEMORY = "max_memory"
    RELOAD = "reload"
    SHUTDOWN = "shutdown"


RESTART_REASONS = tuple(r for r in Exit if r is not Exit.STOPPED and r is not Exit.SHUTDOWN)
"""Every reason a worker is replaced, exported at zero from the first scrape."""


@dataclass
class Running:
    """A job a worker runs, with the watchdog's deadlines (monotonic seconds)."""

    claimed: Claimed
    started: float
    hard_deadline: float | None
    hung_deadline: float | None
    grace_s: float
    interrupted: Interrupt | None = None
    interrupted_at: float = 0.0

    def kill_due(self, now: float) -> tuple[Kill, Interrupt | None] | None:
        """Why the worker must be SIGKILLed now, or None.

        ``HUNG`` when an interrupted handler outlived its grace (the soft
        attempt timeout counts as an interrupt); ``MAX_EXECUTION`` when the
        hard limit passed.
        """
        if self.interrupted is not None and now >= self.interrupted_at + self.grace_s:
            return Kill.HUNG, self.interrupted
        if self.hard_deadline is not None and now >= self.hard_deadline:
            return Kill.MAX_EXECUTION, None
        if self.hung_deadline is not None and now >= self.hung_deadline:
            return Kill.HUNG, Interrupt.ATTEMPT_TIMEOUT
        return None

    def next_deadline(self) -> float | None:
        """The earliest moment :meth:`kill_due` may change its answer."""
        times = [t for t in (self.hard_deadline, self.hung_deadline) if t is not None]
        if self.interrupted is not None:
            times.append(self.interrupted_at + self.grace_s)
        return min(times) if times else None


@dataclass
class ChildProcess:
    """One forked worker and the parent's end of its socket."""

    slot: int
    pid: int
    group: Group
    sock: int
    started: float
    generation: int
    metrics_id: str
    reader: protocol.FrameReader = field(init=False)
    outbox: bytearray = field(default_factory=bytearray)
    booted: bool = False
    job: Running | None = None
    retiring: bool = False
    stop_sent: bool = False
    kill: Kill | None = None
    kill_detail: str | None = None
    leaving: str | None = None
    closed: bool = False
    finished_jobs: int = 0
    eof_at: float = 0.0
    """When the parent read EOF on the worker's socket (0: not yet)."""

    def __post_init__(self) -> None:
        self.reader = protocol.FrameReader(self.sock)

    @property
    def idle(self) -> bool:
        """Booted, running nothing, and staying: it may take a job."""
        return (
            self.booted
            and self.job is None
            and not self.retiring
            and self.kill is None
            and self.leaving is None
            and not self.closed
        )

    def send(self, message: protocol.Message) -> None:
        """Queue ``message`` and write what the socket takes now (never blocks)."""
        self.outbox += protocol.encode(message)
        self.flush()

    def flush(self) -> None:
        """Write as much of the outbox as the socket takes; a broken socket closes it."""
        if not self.outbox or self.closed:
            return
        try:
            sent = os.write(self.sock, self.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.closed = True  # the worker is gone or broke its end; reaping closes ours
            return
        del self.outbox[:sent]

    def close(self) -> None:
        """Close the parent's end of the socket, once: its number may be reused at once."""
        if self.sock < 0:
            return
        self.closed = True
        with contextlib.suppress(OSError):
            os.close(self.sock)
        self.sock = -1
