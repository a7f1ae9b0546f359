"""A worker process: jobs arrive from the parent over a socket, outcomes go back the same way.

The parent sends a worker its next jobs ahead of time; the worker keeps them
in a queue and runs them one after the other in its main thread, reporting
each outcome without waiting for an answer, so it never sleeps between jobs
while its queue holds one. Before it starts a job it marks it started on its
board (board.py), unless the parent took it back meanwhile (a long job ran
ahead of it): a job is never run twice. It never waits for the database on
the hot path: the parent claims for it and writes its plain outcomes. A job
with effects (``chain``, ``on_succeeded``) is settled here, in one
transaction on the worker's own connection (opened on first need, closed
once unused a while: workerstore.py). It dies
with its parent, flushes stdout and stderr, and leaves only through
``os._exit``, so that nothing inherited from the parent (connections, atexit
hooks) runs in it. It never runs a job past the lease its parent last
renewed, even when the parent is stopped (leasewatch.py).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import select
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import NoReturn

from brooq import osproc
from brooq.engine.executor import Executed, Executor
from brooq.engine.outcome import Outcome, SettleKind
from brooq.engine.runner import Attempted, settle_executed
from brooq.engine.store import Claimed, Store
from brooq.logs import LoggingListener, event
from brooq.metrics import Metrics, set_identity
from brooq.queue import Queue
from brooq.supervisor import protocol
from brooq.supervisor.board import Board
from brooq.supervisor.leasewatch import LeaseWatch
from brooq.supervisor.workerstore import WorkerStore
from brooq.vocabulary import DEFAULT_MAX_RESULT_BYTES, StoreUnavailable

log = logging.getLogger("brooq.child")

ABANDONED = Outcome(SettleKind.ABANDON, "abandoned")
"""What a job canceled (or lost) before it started comes to: nothing is written."""


class ExitCode(enum.IntEnum):
    """How a worker process ends; the parent reads it from waitpid."""

    OK = 0
    CRASH = 1
    RECYCLE = 4
    LOST_PARENT = 5
    """Its connection to the parent broke (the parent died, or a handler closed it)."""
    STOPPED_IDLE = 6
    """SIGTERM while it waited for a job: a job the parent sent meanwhile never started."""
    LEASE_ENDING = 8
    """Its handler still ran just before the lease the parent last renewed could end."""


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker process needs besides the app."""

    slot: int
    topics: tuple[str, ...]
    dsn: str
    max_jobs: int = 0
    max_memory: int = 0
    notify: bool = True
    max_payload_bytes: int = 1024 * 1024
    metrics_id: str = "w0"
    prepare: bool = True
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    log_jobs: bool = False
    """Log every job at INFO (JobClaimed, JobDone); failures are logged either way."""
    lease_s: float = 0.0
    """The lease: the worker stops a job before the lease posted on its board ends (0: not)."""
    statement_timeout: timedelta | None = None
    idle_timeout: timedelta | None = None
    """Bounds of the worker's connection: a statement, a transaction left idle (services.py)."""
    connection_idle_s: float = 60.0
    """The worker closes its connection once unused this long (QUEUE_WORKER_CONNECTION_IDLE)."""
    app_version: str | None = None  # the supervisor's: the jobs a worker chains carry it


class _Stopping(BaseException):
    """Raised by SIGTERM while idle: leave the blocking read and exit."""


INTERRUPT_CODES = {signal.SIGUSR1: 1, signal.SIGUSR2: 2}
"""The code the parent posts on the board for the interrupt each signal carries."""


class Worker:
    """The loop of one worker process: its queue of jobs, run one after the other."""

    def __init__(
        self, queue: Queue, config: WorkerConfig, sock: int, board: Board | None,
        metrics: Metrics | None = None,
    ) -> None:  # fmt: skip
        self.queue, self.config, self.sock, self.board = queue, config, sock, board
        self.executor = Executor(
            queue.registry, config.max_result_bytes, parents=lambda job: self.store.parents(job)
        )
        self.executor.interrupts.accept = self._interrupt_is_ours
        self.metrics = metrics
        self.log = LoggingListener(every_job=config.log_jobs)
        self.reader = protocol.FrameReader(sock)
        self.jobs: deque[protocol.Assign] = deque()
        """Jobs the parent sent ahead, not started yet."""
        self.current, self.current_id = 0, ""
        """The sequence number (0: none) and id of the job running now."""
        self.finished = 0
        self.stop_asked = False
        self.stopping = False
        self.busy = False
        self.damaged = False
        self.own = WorkerStore(config)
        self.watch: LeaseWatch | None = None
        if board is not None and config.lease_s > 0:
            running, ends = (lambda: self.current), self._lease_ends
            self.watch = LeaseWatch(board.lease_until, config.lease_s, running, ends)

    @property
    def store(self) -> Store:
        """The worker's own store, for settles with effects; connects on first use."""
        return self.own.store

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True  # finish the running job, then leave
        if not self.busy:
            raise _Stopping

    def _interrupt_is_ours(self, signum: int) -> bool:
        """A cancel or a lost lease is for the job the parent named, never the next one
        (without a board the worker holds one job at a time: it is that one)."""
        code = INTERRUPT_CODES.get(signal.Signals(signum))
        if code == 1 and self.watch is not None and self.watch.fired_for == self.current:
            return True  # the worker's own watch: the lease ends
        return code is None or self.board is None or self.board.interrupt_for(self.current) == code

    def _lease_ends(self, seq: int, left_s: float) -> NoReturn:
        """The handler still runs as the lease ends: leave now (the watch's thread)."""
        job, left = self.current_id, round(left_s, 3)
        event(log, "LeaseEnding", logging.WARNING, action="exit", left_s=left, job_id=job)
        osproc.flush_stdio()
        os._exit(ExitCode.LEASE_ENDING)

    def install_signals(self) -> None:
        """TERM: finish the job, then leave. INT is ignored: the parent decides what a ^C
        means (a worker leads a process group of its own, but a handler may signal its
        group or the terminal's)."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, self._on_term)
        for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
            signal.signal(signum, signal.SIG_IGN)
        for signum in (signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        self.executor.interrupts.install()

    def send(self, message: protocol.Message) -> None:
        """Tell the parent (never waiting for an answer); a broken connection (EPIPE, EBADF)
        ends this process."""
        try:
            protocol.write_message(self.sock, message)
        except OSError:
            os._exit(ExitCode.LOST_PARENT)

    def run(self) -> int:
        """Run the jobs the parent sends, in order, until told to stop or due to leave."""
        os.set_blocking(self.sock, False)
        if self.watch is not None:
            self.watch.start()
        self.idle()
        self.send(protocol.Booted())
        try:
            while True:
                if not self.jobs and not self.stop_asked:
                    self.wait_for_jobs()
                if not self.receive():
                    return ExitCode.LOST_PARENT
                if self.stop_asked:
                    return ExitCode.OK  # the parent puts back what was not started
                if self.jobs:
                    code = self.take(self.jobs.popleft())
                    if code is not None:
                        return code
        except _Stopping:
            return ExitCode.STOPPED_IDLE
        except (OSError, protocol.ProtocolError):
            return ExitCode.LOST_PARENT

    def wait_for_jobs(self) -> None:
        """Nothing queued: show it in ps and sleep until the parent writes (waking once to
        close the worker's connection when it goes unused for its bound meanwhile)."""
        self.idle()
        left = self.own.look()
        if left is not None and select.select([self.sock], [], [], left)[0]:
            return
        self.own.look()
        select.select([self.sock], [], [])

    def receive(self) -> bool:
        """Queue what the parent sent (never waiting); False when the parent is gone."""
        messages, eof = self.reader.read()
        for message in messages:
            match message:
                case protocol.Assign():
                    self.jobs.append(message)
                case protocol.Stop():
                    self.stop_asked = True
        return not eof

    def take(self, assign: protocol.Assign) -> int | None:
        """Run one job unless the parent took it back; the exit code when leaving now.

        ``busy`` covers the whole exchange, the report included: a SIGTERM then
        only marks the worker stopping, so no message is ever cut in half.
        """
        self.busy = True
        try:
            if self.board is not None and not self.board.start(assign.seq):
                return None  # taken back: another worker runs it
            self.current, self.current_id = assign.seq, assign.claimed.id
            if self.watch is not None:
                self.watch.job_started()
            finished = self.execute(assign.claimed)
            self.current = 0
            self.finished += 1
            self.own.look()
            leaving = self.leaving_reason()
            self.send(
                protocol.Finished(
                    assign.seq,
                    finished.ticket,
                    finished.outcome,
                    finished.duration_s,
                    finished.written,
                    leaving,
                )
            )
            return None if leaving is None else _exit_for(leaving)
        finally:
            self.current = 0
            self.busy = False

    def execute(self, claimed: Claimed) -> protocol.Finished:
        """Run the handler; settle here when the job has effects, else hand the outcome back.

        A job whose cancel or lost lease was posted before it started is not run.
        """
        if self.board is not None and self.board.interrupt_for(self.current):
            return protocol.Finished(self.current, claimed.ticket, ABANDONED, 0.0)
        if self.watch is not None and (left := self.watch.too_late(time.monotonic())) is not None:
            self.lease_ending(claimed, "skip", left)
            return protocol.Finished(self.current, claimed.ticket, ABANDONED, 0.0)
        options = self.executor.options(claimed)
        osproc.title(
            f"brooq worker {self.config.slot}: {claimed.topic} job {claimed.id} "
            f"attempt {claimed.attempt}"
        )
        self.log.claimed(claimed, options)
        owned = self.owned_fds()
        executed = self.executor.run(claimed)
        if self.watch is not None and self.watch.fired_for == self.current:
            self.lease_ending(claimed, "interrupt", self.watch.too_late(time.monotonic()))
        self.check_fds(owned, claimed)
        outcome, written = executed.outcome, None
        if executed.has_effects:
            outcome, written = self.settle_here(executed)
        self.executor.settled(executed, outcome, written)
        duration = time.monotonic() - executed.started
        self.log.settled(Attempted(claimed, outcome, written, duration))
        if self.metrics:
            self.metrics.duration.labels(topic=claimed.topic).observe(duration)
        return protocol.Finished(self.current, claimed.ticket, outcome, duration, written)

    def settle_here(self, executed: Executed) -> tuple[Outcome, bool]:
        """Write done with the job's effects in one transaction; an outage writes nothing.

        A connection that broke (a restarted or terminated backend) is opened
        again for one more try: the fence makes it safe, and it spares the job
        a wait for its lease to run out.
        """
        try:
            try:
                return settle_executed(self.store, executed)
            except StoreUnavailable:
                return settle_executed(self.store, executed)
        except StoreUnavailable as exc:
            # Nothing was written: the parent stops keeping the lease, the reaper
            # returns the job, and it runs again (at least once).
            log.warning(
                "database unavailable; the job will run again",
                extra={
                    "event": "DatabaseUnavailable",
                    "error": str(exc),
                    "job_id": executed.claimed.id,
                },
            )
            return executed.outcome, False

    def lease_ending(self, claimed: Claimed, action: str, left_s: float | None) -> None:
        """Say that the worker itself stopped (or did not start) a job as its lease ends."""
        left = None if left_s is None else round(left_s, 3)
        event(log, "LeaseEnding", logging.WARNING, action=action, left_s=left, job_id=claimed.id)

    def owned_fds(self) -> dict[int, osproc.FdIdentity]:
        """What the worker's own descriptors are: stdio, its socket, its database connection."""
        fds = [0, 1, 2, self.sock]
        if (fd := self.own.fileno()) is not None:
            fds.append(fd)
        return osproc.fd_identities(fds)

    def check_fds(self, before: dict[int, osproc.FdIdentity], claimed: Claimed) -> None:
        """After a handler: did it close (or replace) a descriptor the worker owns?

        Its socket to the parent: the outcome cannot be reported (a write there
        could even land in a file the handler opened), so leave now; the parent
        records the crash. Its database connection: forget it unclosed (closing
        would close whatever holds the number now) and open a new one. Stdio:
        later logs would be lost or, once a new socket takes the number, written
        into it. Any of them: report, then leave for a fresh worker.
        """
        now = osproc.fd_identities(list(before))
        damaged = [fd for fd, identity in before.items() if now[fd] != identity]
        if not damaged:
            return
        if self.sock in damaged:
            os._exit(ExitCode.LOST_PARENT)
        if self.own.fileno() in damaged:
            self.own.forget()
        self.damaged = True
        log.warning(
            "the handler closed descriptors the worker owns; it leaves after this job",
            extra={
                "event": "WorkerDamaged",
                "job_id": claimed.id,
                "topic": claimed.topic,
                "fds": ",".join(map(str, damaged)),
            },
        )

    def leaving_reason(self) -> str | None:
        """Why this worker must leave before its next job, or None."""
        if self.damaged:
            return "broken"
        if self.stopping:
            return "stopping"
        if self.config.max_jobs and self.finished >= self.config.max_jobs:
            return "max_jobs"
        if self.config.max_memory and osproc.rss_bytes() > self.config.max_memory:
            return "max_memory"
        return None

    def idle(self) -> None:
        """Show the worker as idle in ps."""
        osproc.title(f"brooq worker {self.config.slot}: idle")


def _exit_for(reason: str) -> int:
    return ExitCode.RECYCLE if reason.startswith("max_") else ExitCode.OK


def worker_main(
    queue: Queue,
    config: WorkerConfig,
    sock: int,
    board: Board | None,
    parent_pid: int,
    metrics: Metrics | None = None,
) -> NoReturn:
    """Entry point after fork; never returns."""
    code: int = ExitCode.CRASH
    try:
        osproc.die_with_parent(parent_pid)
        osproc.lead_process_group()  # what a handler forks dies with this worker
        set_identity(config.metrics_id)
        worker = Worker(queue, config, sock, board, metrics)
        worker.install_signals()
        code = worker.run()
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):  # _exit skips atexit: flush middleware (spans)
            queue.registry.middleware.process_exit()
        osproc.flush_stdio()  # what a handler printed must reach the log: _exit skips it
        os._exit(code)
