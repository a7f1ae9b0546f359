"""A worker process: one connection opened after fork, one slot, reports over a pipe.

It claims, runs the handler in its main thread, settles in a transaction,
and tells the parent what it claimed and when it finished. It dies with its
parent, and leaves only through ``os._exit`` so that nothing inherited from
the parent (connections, atexit hooks) runs in it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import NoReturn

from brooq import osproc
from brooq.engine.runner import Attempted, SlotRunner
from brooq.engine.store import Claimed
from brooq.logs import LoggingListener
from brooq.metrics import Metrics, set_identity
from brooq.postgres.store import PostgresStore
from brooq.queue import Queue
from brooq.supervisor import protocol
from brooq.vocabulary import KindOptions, StoreUnavailable

log = logging.getLogger("brooq.child")

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_RECYCLE = 4
MAX_RECONNECT_BACKOFF_S = 30.0


@dataclass(frozen=True)
class ChildConfig:
    """What one worker process needs."""

    slot: int
    topics: list[str]
    dsn: str
    lease: timedelta
    poll_interval: timedelta
    max_jobs: int = 0
    max_memory: int = 0
    notify: bool = True
    max_payload_bytes: int = 1024 * 1024
    metrics_id: str = "w0"


class ChildListener:
    """Reports claims and outcomes to the parent, keeps the process title, logs events."""

    def __init__(self, fd: int, slot: int, metrics: Metrics | None = None) -> None:
        self.fd, self.slot = fd, slot
        self.current: str | None = None
        self.log = LoggingListener()
        self.metrics = metrics

    def claimed(self, claimed: Claimed, options: KindOptions) -> None:
        """Tell the parent before the handler starts, so it can keep the lease."""
        self.current = claimed.id
        protocol.send(self.fd, protocol.ClaimedJob(claimed.id, claimed.attempt, claimed.topic))
        osproc.title(f"brooq worker {self.slot}: {claimed.topic} job {claimed.id} "
                     f"attempt {claimed.attempt}")
        if self.metrics:
            self.metrics.claimed.labels(topic=claimed.topic).inc()
            self.metrics.busy.labels(topic=claimed.topic).set(1)
        self.log.claimed(claimed, options)

    def settled(self, attempted: Attempted) -> None:
        """Tell the parent the job is no longer ours."""
        label = attempted.outcome.label if attempted.written else "lost"
        self.finish(attempted.claimed.id, label)
        if self.metrics:
            topic = attempted.claimed.topic
            if attempted.written:
                self.metrics.settled.labels(topic=topic, outcome=label).inc()
            self.metrics.duration.labels(topic=topic).observe(attempted.duration_s)
            self.metrics.busy.labels(topic=topic).set(0)
        self.log.settled(attempted)

    def finish(self, job_id: str, label: str) -> None:
        """Report the end of ``job_id`` and go back to idle."""
        self.current = None
        protocol.send(self.fd, protocol.FinishedJob(job_id, label))
        osproc.title(f"brooq worker {self.slot}: idle")


class Child:
    """The loop of one worker process."""

    def __init__(self, queue: Queue, config: ChildConfig, report_fd: int,
                 metrics: Metrics | None = None) -> None:
        self.queue, self.config, self.fd = queue, config, report_fd
        self.parent_pid = os.getppid()
        self.stopping = False
        self.jobs = 0
        self.store = PostgresStore(config.dsn, notify=config.notify,
                                   max_payload_bytes=config.max_payload_bytes)
        self.listener = ChildListener(report_fd, config.slot, metrics)
        holder = f"{socket.gethostname()}:{os.getpid()}"
        self.runner = SlotRunner(self.store, queue.registry, holder, config.lease,
                                 config.topics, self.listener, prefetch=self._want_next)

    def _want_next(self) -> bool:
        # Claim the next job with this settle only if this process will run it:
        # not stopping, and not due for recycling once this job is counted.
        return not self.stopping and self._recycle_reason(self.jobs + 1) is None

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True  # finish the running job, then leave

    def install_signals(self) -> None:
        """TERM: finish the job, then leave. INT is ignored: a terminal's ^C reaches the
        whole process group, and the parent decides what it means."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, self._on_term)
        for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
            signal.signal(signum, signal.SIG_IGN)
        for signum in (signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        self.runner.interrupts.install()

    def run(self) -> int:
        """Claim and run jobs until told to stop or due for recycling; the exit code."""
        osproc.title(f"brooq worker {self.config.slot}: idle")
        protocol.send(self.fd, protocol.Booted())
        backoff = 0.2
        while not self.stopping or self.runner.has_prefetched:
            try:
                worked = self.runner.run_once() is not None
                if not worked and not self.stopping:
                    self.store.wait_for_jobs(self.config.poll_interval.total_seconds())
                    if os.getppid() != self.parent_pid:
                        return EXIT_OK  # orphaned (no PR_SET_PDEATHSIG here): stop claiming
                backoff = 0.2
            except StoreUnavailable as exc:
                self._unsettled()
                log.warning("database unavailable; retrying", extra={
                    "event": "DatabaseUnavailable", "error": str(exc), "retry_in_s": backoff})
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF_S)
                continue
            if worked:
                self.jobs += 1
                reason = self._recycle_reason(self.jobs)
                if reason and not self.runner.has_prefetched:  # run a claimed job first
                    protocol.send(self.fd, protocol.Recycling(reason))
                    return EXIT_RECYCLE
        return EXIT_OK

    def _unsettled(self) -> None:
        # The outcome of the running job could not be written: the parent stops
        # keeping its lease, the reaper returns it, and it runs again.
        if self.listener.current is not None:
            self.listener.finish(self.listener.current, "unsettled")

    def _recycle_reason(self, jobs: int) -> str | None:
        if self.config.max_jobs and jobs >= self.config.max_jobs:
            return "max_jobs"
        if self.config.max_memory and osproc.rss_bytes() > self.config.max_memory:
            return "max_memory"
        return None


def child_main(
    queue: Queue, config: ChildConfig, report_fd: int, parent_pid: int,
    metrics: Metrics | None = None,
) -> NoReturn:
    """Entry point after fork; never returns."""
    code = EXIT_CRASH
    try:
        osproc.die_with_parent(parent_pid)
        set_identity(config.metrics_id)
        child = Child(queue, config, report_fd, metrics)
        child.install_signals()
        code = child.run()
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)
