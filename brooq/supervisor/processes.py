"""The supervisor's worker processes: fork, signal, reap, and the records of them.

Everything here is about processes, not jobs: which worker runs in which
slot, which ones are broken or hung, which must be retired. What becomes of
a job is the arbiter's (and the orphans service's) decision.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NoReturn

from brooq import metrics as prom
from brooq import osproc
from brooq.config import Settings
from brooq.logs import event
from brooq.queue import Queue
from brooq.supervisor import services
from brooq.supervisor.board import Board
from brooq.supervisor.child import WorkerConfig, worker_main
from brooq.supervisor.children import ChildProcess, Interrupt, Kill
from brooq.supervisor.slots import SlotState

log = logging.getLogger("brooq.supervisor")

FORK_WAIT_S = 0.05
"""How long a spawn waits for the database and LISTEN threads to leave libpq."""
BROKEN_GRACE_S = 0.5
"""How long a worker whose socket closed may take to exit before it counts as broken."""


class Processes:
    """The live worker processes of one supervisor, by pid."""

    def __init__(
        self,
        queue: Queue,
        settings: Settings,
        dsn: str,
        metrics: prom.Metrics,
        parent_pid: int,
        parent_fds: Callable[[], Sequence[int]],
        parent_signals: Sequence[signal.Signals],
    ) -> None:
        self.queue, self.settings, self.dsn, self.metrics = queue, settings, dsn, metrics
        self.parent_pid = parent_pid
        self.parent_fds = parent_fds
        """The parent's own file descriptors, closed in each new worker."""
        self.parent_signals = parent_signals
        self.children: dict[int, ChildProcess] = {}
        self.free_metric_ids: list[int] = []
        self.next_metric_id = 0
        self.boards_off = False

    def __iter__(self) -> Iterator[ChildProcess]:
        return iter(list(self.children.values()))

    def __len__(self) -> int:
        return len(self.children)

    # --- fork and reap ------------------------------------------------------------------

    def spawn(self, slot_no: int, slot: SlotState, generation: int) -> ChildProcess | None:
        """Fork one worker for ``slot_no``, connected by a socket pair and sharing a board
        (None: try next tick)."""
        parent_end, child_end = socket.socketpair()
        board = self.new_board()
        metrics_id = self.take_metrics_id()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = osproc.fork_when_quiet(timeout=FORK_WAIT_S)
        if pid is None:  # a thread is busy with the database: the next tick tries again
            parent_end.close()
            child_end.close()
            self.free_metric_ids.append(int(metrics_id[1:]))
            return None
        if pid == 0:
            self.become_child(
                parent_end.detach(), child_end.detach(), slot_no, slot, metrics_id, board
            )
        child_end.close()
        sock = parent_end.detach()
        os.set_blocking(sock, False)
        child = ChildProcess(
            slot=slot_no,
            pid=pid,
            group=slot.group,
            sock=sock,
            started=time.monotonic(),
            generation=generation,
            metrics_id=metrics_id,
            board=board,
        )
        self.children[pid] = child
        event(log, "WorkerStarted", slot=slot_no, pid=pid, topics=",".join(slot.topics))
        return child

    def new_board(self) -> Board | None:
        """A board for the next worker; None (and one warning) where the system has no shared
        semaphores: its workers then get one job at a time."""
        if self.boards_off:
            return None
        try:
            return Board()
        except OSError as exc:
            self.boards_off = True
            event(
                log,
                "WorkerQueueOff",
                logging.WARNING,
                error=str(exc),
                note="no shared semaphore (is /dev/shm mounted?): one job at a time per worker",
            )
            return None

    def become_child(
        self,
        parent_end: int,
        child_end: int,
        slot_no: int,
        slot: SlotState,
        metrics_id: str,
        board: Board | None,
    ) -> NoReturn:
        """In the new worker: drop the parent's signal handling and descriptors, then work."""
        for signum in self.parent_signals:
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for fd in [parent_end, *self.parent_fds(), *(c.sock for c in self.children.values())]:
            with contextlib.suppress(OSError):
                os.close(fd)
        s = self.settings
        config = WorkerConfig(
            slot=slot_no,
            topics=tuple(slot.topics),
            dsn=self.dsn,
            max_jobs=s.max_jobs_per_worker,
            max_memory=s.max_memory_per_worker,
            notify=s.notify,
            max_payload_bytes=s.max_payload_bytes,
            metrics_id=metrics_id,
            log_jobs=s.log_jobs,
            lease_s=s.lease.total_seconds(),
            statement_timeout=services.statement_bound(s.lease),
            idle_timeout=services.idle_transaction_bound(s.lease),
            connection_idle_s=s.worker_connection_idle.total_seconds(),
            max_result_bytes=s.max_result_bytes,
            app_version=self.queue.app_version,
        )
        worker_main(self.queue, config, child_end, board, self.parent_pid, self.metrics)

    def reaped(self) -> Iterator[tuple[ChildProcess, int]]:
        """waitpid every worker that ended: each record with its wait status."""
        # reap_any also kills what is left of the worker's process group (its forks);
        # a pid that is no worker is a grandchild reparented to us (we are a subreaper).
        while (ended := osproc.reap_any()) is not None:
            pid, status = ended
            child = self.children.pop(pid, None)
            if child is not None:
                prom.mark_dead(child.metrics_id)
                self.free_metric_ids.append(int(child.metrics_id[1:]))
                yield child, status

    def take_metrics_id(self) -> str:
        """The lowest metrics id no live (unreaped) worker holds: files are reused."""
        if self.free_metric_ids:
            self.free_metric_ids.sort()
            return f"w{self.free_metric_ids.pop(0)}"
        self.next_metric_id += 1
        return f"w{self.next_metric_id - 1}"

    # --- signals to workers -------------------------------------------------------------

    def kill(self, child: ChildProcess, reason: Kill, detail: Interrupt | None = None) -> None:
        """SIGKILL a worker; ``reason`` decides what becomes of its job."""
        child.kill, child.kill_detail = reason, str(detail) if detail else None
        shown = f"{reason}:{detail}" if detail else str(reason)
        event(
            log,
            "WorkerKilled",
            logging.WARNING,
            slot=child.slot,
            pid=child.pid,
            reason=shown,
            job_id=child.job.claimed.id if child.job else None,
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)

    def kill_all(self, reason: Kill) -> None:
        """SIGKILL every worker not already killed."""
        for child in self:
            if child.kill is None:
                self.kill(child, reason)

    def kill_broken(self, now: float) -> None:
        """Kill workers still alive a while after their socket closed."""
        for child in self:
            if child.eof_at and child.kill is None and now - child.eof_at >= BROKEN_GRACE_S:
                self.kill(child, Kill.BROKEN)

    def kill_hung(self, now: float) -> None:
        """SIGKILL workers past their watchdog deadlines."""
        for child in self:
            if child.job and child.kill is None and (due := child.job.kill_due(now)):
                kill, why = due
                if kill is Kill.HUNG:
                    self.metrics.hung.labels(topic=child.job.claimed.topic).inc()
                self.kill(child, kill, why)

    def kill_strays(self) -> list[int]:
        """SIGKILL every child of the supervisor that is not one of its workers (what an app's
        import forked, or what escaped a dead worker's group); the pids killed."""
        workers = set(self.children)
        strays = [p for p in osproc.children_of(os.getpid()) if p not in workers]
        for pid in strays:
            osproc.kill_tree(pid)
        if strays:
            event(log, "StraysKilled", logging.WARNING, pids=",".join(map(str, strays)))
        return strays

    # --- the target -----------------------------------------------------------------------

    def manage(
        self,
        slots: list[SlotState],
        generation: int,
        retire: Callable[[ChildProcess], None],
        now: float,
    ) -> None:
        """Bring the workers back to the target: retire extra and old ones, spawn missing.

        A new generation (SIGHUP) replaces idle old workers first; a busy one
        gets the graceful timeout to finish its job, then is stopped as SIGTERM
        stops it (its job released uncharged). The next old worker goes only once
        every new one has booted: new code that dies at boot costs one slot.
        """
        for child in self:
            if child.slot >= len(slots) and not child.retiring:
                retire(child)
        current = [c for c in self if c.generation == generation]
        old = [c for c in self if c.generation < generation and not c.retiring]
        if old and all(c.booted for c in current):
            retire(min(old, key=lambda c: (bool(c.queue), c.started)))  # idle ones first
        self.stop_overdue(generation, now)
        taken = {c.slot for c in self if not c.retiring}
        for slot_no, slot in enumerate(slots):
            if slot_no not in taken and now >= slot.not_before:
                self.spawn(slot_no, slot, generation)

    def stop_overdue(self, generation: int, now: float) -> None:
        """Old workers still busy a graceful timeout after they were retired: stop them."""
        grace = self.settings.graceful_timeout.total_seconds()
        for child in self:
            if (
                child.retiring
                and child.generation < generation
                and child.kill is None
                and now - child.retired_at >= grace
            ):
                self.kill(child, Kill.SHUTDOWN)

    # --- questions --------------------------------------------------------------------------

    def rolled(self, generation: int, slots: int) -> bool:
        """True once ``slots`` workers run and every one is of ``generation`` and booted."""
        children = self.children.values()
        return len(self.children) >= slots and all(
            c.generation == generation and c.booted for c in children
        )

    def flush(self, writable: Iterable[int]) -> None:
        """Write what waits for the workers whose socket can take more now."""
        ready = set(writable)
        for child in self.children.values():
            if child.sock in ready:
                child.flush()

    def sockets(self) -> tuple[list[int], list[int]]:
        """The sockets to wait on: all open ones for reading, those with output for writing."""
        reads = [c.sock for c in self.children.values() if not c.closed]
        writes = [c.sock for c in self.children.values() if c.outbox and not c.closed]
        return reads, writes
