"""Between the buffer and the workers: hand out jobs, take back outcomes, interrupt.

A worker that reports an outcome gets its next job from its group's buffer
in the same tick (a socket round trip, no SQL). Plain outcomes go to the
completer; outcomes a worker wrote itself (jobs with effects) are only
counted. Interrupts (a cancel, a lost lease, a lease about to end) reach the
handler as a signal; the watchdog kills it if it does not stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable

from brooq import metrics as prom
from brooq.engine.kinds import Registry
from brooq.engine.outcome import SettleKind
from brooq.engine.store import Claimed
from brooq.logs import event
from brooq.supervisor import protocol
from brooq.supervisor.children import ChildProcess, Interrupt, Running
from brooq.supervisor.completer import Completer
from brooq.supervisor.leases import Holdings
from brooq.supervisor.producer import Producer
from brooq.vocabulary import KindOptions

log = logging.getLogger("brooq.supervisor")

SIGNAL_OF = {
    Interrupt.LEASE_LOST: signal.SIGUSR1,
    Interrupt.CANCELED: signal.SIGUSR2,
}


class Dispatcher:
    """Assigns buffered jobs to idle workers and applies what workers report."""

    def __init__(
        self,
        kinds: Registry,
        producer: Producer,
        completer: Completer,
        holdings: Holdings,
        metrics: prom.Metrics,
        default_grace_s: float,
        retire: Callable[[ChildProcess], None],
    ) -> None:
        self.kinds, self.producer, self.completer = kinds, producer, completer
        self.holdings, self.metrics = holdings, metrics
        self.default_grace_s = default_grace_s
        self.retire = retire

    def run_once(self, children: Iterable[ChildProcess], now: float) -> int:
        """Give every idle worker a job from its group's buffer; how many went out."""
        sent = 0
        for child in children:
            if self.completer.full:
                break  # the database falls behind: let it catch up first
            if not child.idle:
                continue
            claimed = self.producer.take(child.group)
            if claimed is None:
                continue
            child.job = self.running(claimed, now)
            child.send(protocol.Assign(claimed))
            sent += 1
        return sent

    def options(self, topic: str) -> KindOptions:
        """The complete options of ``topic`` (the defaults for a topic with no handler)."""
        return self.kinds.options(topic) if topic in self.kinds else self.kinds.defaults

    def running(self, claimed: Claimed, now: float) -> Running:
        """The watchdog's deadlines for a job going out to a worker."""
        options = self.options(claimed.topic)
        grace = (
            options.watchdog_grace.total_seconds()
            if options.watchdog_grace
            else self.default_grace_s
        )
        hard, soft = options.max_execution_timeout, options.attempt_timeout
        return Running(
            claimed=claimed,
            started=now,
            grace_s=grace,
            hard_deadline=now + hard.total_seconds() if hard else None,
            hung_deadline=now + soft.total_seconds() + grace if soft else None,
        )

    def read(self, child: ChildProcess, now: float) -> bool:
        """Apply what ``child`` sent; False when it sent garbage (its socket is closed then).

        At EOF our end is closed too: most often the worker just exited (the
        reaper names why); one that lives on without its socket closed it by
        mistake and is of no more use.
        """
        if child.closed:
            return True
        try:
            messages, eof = child.reader.read()
        except protocol.ProtocolError:
            child.close()
            return False
        for message in messages:
            self.apply(child, message, now)
        if eof:
            child.close()
            child.eof_at = now
        return True

    def apply(self, child: ChildProcess, message: protocol.Message, now: float) -> None:
        """Act on one message of ``child``."""
        match message:
            case protocol.Booted():
                child.booted = True
            case protocol.Finished() as finished:
                self.finished(child, finished, now)
            case protocol.Returned(job_id, reason):
                job, child.job, child.leaving = child.job, None, reason
                if job is not None and job.claimed.id == job_id:
                    self.producer.put_back(child.group, job.claimed, now)

    def finished(self, child: ChildProcess, msg: protocol.Finished, now: float) -> None:
        """A worker is done with its job: queue or count the outcome, free the worker."""
        job = child.job
        if job is None or job.claimed.ticket != msg.ticket:
            return
        child.job, child.leaving = None, msg.leaving
        child.finished_jobs += 1
        self.producer.finished(child.group, now, now - job.started)
        topic, job_id = job.claimed.topic, msg.ticket.job_id
        if msg.written is not None or msg.outcome.kind is SettleKind.ABANDON:
            self.holdings.drop(job_id)
            if msg.written:
                self.metrics.settled.labels(topic=topic, outcome=msg.outcome.label).inc()
            elif msg.written is False:
                self.metrics.lease_lost.labels(topic=topic).inc()
        elif job_id in self.holdings:
            self.completer.add(msg.ticket, msg.outcome, topic, now)
        if child.retiring and child.leaving is None:
            self.retire(child)

    def interrupt(self, child: ChildProcess, reason: Interrupt, note: str) -> None:
        """Raise an Interrupted in the handler; the watchdog kills it after the grace."""
        job = child.job
        if job is None or job.interrupted is not None:
            return
        job.interrupted, job.interrupted_at = reason, time.monotonic()
        event(
            log,
            "JobCanceled" if reason is Interrupt.CANCELED else "LeaseLost",
            job_id=job.claimed.id,
            topic=job.claimed.topic,
            pid=child.pid,
            note=note,
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, SIGNAL_OF.get(reason, signal.SIGUSR1))
