"""The parent's view of its worker processes: who runs what, and until when it may."""

from __future__ import annotations

import contextlib
import os
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from brooq.engine.store import Claimed
from brooq.supervisor import protocol
from brooq.supervisor.board import Board
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
    """A job sent to a worker: queued there until the worker starts it, then running.

    ``started`` is the worker's own start time (monotonic, read from its board),
    None while the job waits in the worker's queue. The watchdog's deadlines
    count from it.
    """

    claimed: Claimed
    seq: int
    sent: float
    grace_s: float
    hard_s: float | None = None
    """``max_execution_timeout`` in seconds (None: no hard limit)."""
    soft_s: float | None = None
    """``attempt_timeout`` in seconds (None: none)."""
    started: float | None = None
    interrupted: Interrupt | None = None
    interrupted_at: float = 0.0

    @property
    def hard_deadline(self) -> float | None:
        """When the supervisor kills the worker, whatever the handler does."""
        if self.started is None or self.hard_s is None:
            return None
        return self.started + self.hard_s

    @property
    def hung_deadline(self) -> float | None:
        """When a handler past its soft timeout has had its grace and is killed."""
        if self.started is None or self.soft_s is None:
            return None
        return self.started + self.soft_s + self.grace_s

    def kill_due(self, now: float) -> tuple[Kill, Interrupt | None] | None:
        """Why the worker must be SIGKILLed now, or None.

        ``HUNG`` when an interrupted handler outlived its grace (the soft
        attempt timeout counts as an interrupt); ``MAX_EXECUTION`` when the
        hard limit passed.
        """
        if self.interrupted is not None and now >= self.interrupted_at + self.grace_s:
            return Kill.HUNG, self.interrupted
        hard, hung = self.hard_deadline, self.hung_deadline
        if hard is not None and now >= hard:
            return Kill.MAX_EXECUTION, None
        if hung is not None and now >= hung:
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
    """One forked worker, the parent's end of its socket, and the jobs sent to it."""

    slot: int
    pid: int
    group: Group
    sock: int
    started: float
    generation: int
    metrics_id: str
    board: Board | None = None
    reader: protocol.FrameReader = field(init=False)
    outbox: bytearray = field(default_factory=bytearray)
    queue: deque[Running] = field(default_factory=deque)
    """Jobs sent and not finished, in the order sent: the first may be running."""
    last_seq: int = 0
    booted: bool = False
    retiring: bool = False
    retired_at: float = 0.0
    """When it was told to start no more jobs (monotonic)."""
    stop_sent: bool = False
    kill: Kill | None = None
    kill_detail: str | None = None
    leaving: str | None = None
    closed: bool = False
    finished_jobs: int = 0
    eof_at: float = 0.0
    """When the parent read EOF on the worker's socket (0: not yet)."""
    lease_until: float = 0.0
    """The earliest lease end (monotonic) of the jobs sent to the worker, as last posted on its
    board: the worker stops its handler before then, whatever becomes of the parent."""

    def __post_init__(self) -> None:
        self.reader = protocol.FrameReader(self.sock)

    @property
    def job(self) -> Running | None:
        """The job the worker runs now (it marked it started on its board), or None."""
        if self.queue and self.queue[0].started is not None:
            return self.queue[0]
        return None

    @property
    def open(self) -> bool:
        """Booted and staying: jobs may be sent to it."""
        return (
            self.booted
            and not self.retiring
            and self.kill is None
            and self.leaving is None
            and not self.closed
        )

    def observe(self) -> None:
        """Read the board: the first job in the queue has started, and when (without a board
        a worker holds one job, counted as started when it was sent)."""
        if not self.queue or self.queue[0].started is not None:
            return
        if self.board is None:
            self.queue[0].started = self.queue[0].sent
            return
        started, head = self.board.started(), self.queue[0]
        if started.seq >= head.seq and started.at >= head.sent:
            head.started = started.at

    def assign(self, running: Running) -> None:
        """Queue ``running`` for the worker (the message goes out with the next flush);
        FrameTooLarge, and nothing queued, when it cannot be sent."""
        frame = protocol.encode(protocol.Assign(running.seq, running.claimed))
        self.queue.append(running)
        self.last_seq = running.seq
        self.outbox += frame

    def post_lease(self, until: float) -> None:
        """Tell the worker (on its board) that the leases of its jobs hold until ``until``."""
        self.lease_until = until
        if self.board is not None:
            self.board.post_lease(until)

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
