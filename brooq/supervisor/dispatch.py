"""Between the buffer and the workers: queue jobs in each worker, take them back, interrupt.

Each worker holds a small queue of jobs sent ahead of time, so a short job's
next job is already in its socket when it finishes: a worker never sleeps
between jobs, and the parent reads and writes its sockets in batches. How
many jobs wait behind the running one comes from each topic's measured
service time: enough to cover HORIZON_S of work (at most MAX_QUEUED), and
none behind a job expected to take longer than LONG_JOB_S (its next job
would only wait). A job queued behind one that runs longer than expected is
taken back (board.py: never run twice) and handed to another worker.

Plain outcomes go to the completer; outcomes a worker wrote itself (jobs
with effects) are only counted. Interrupts (a cancel, a lost lease, a lease
about to end) reach the handler as a signal, named on the worker's board so
they never hit the job after it; the watchdog kills a handler that does not
stop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from brooq import metrics as prom
from brooq.engine.kinds import Registry
from brooq.engine.outcome import Outcome, SettleKind
from brooq.engine.store import Claimed
from brooq.logs import event
from brooq.supervisor import protocol
from brooq.supervisor.children import ChildProcess, Interrupt, Running
from brooq.supervisor.completer import Completer
from brooq.supervisor.leases import Holdings
from brooq.supervisor.producer import Group, Producer
from brooq.vocabulary import KindOptions

log = logging.getLogger("brooq.supervisor")

SIGNAL_OF = {
    Interrupt.LEASE_LOST: signal.SIGUSR1,
    Interrupt.CANCELED: signal.SIGUSR2,
}
CODE_OF = {Interrupt.LEASE_LOST: 1, Interrupt.CANCELED: 2}
"""What the board names for each interrupt (the worker's INTERRUPT_CODES by signal)."""

HORIZON_S = 0.004
"""Queue this much expected work behind a worker's running job: more than the parent takes
to come back to it (a tick or two), so the worker never waits for the parent."""
MAX_QUEUED = 64
"""The most jobs sent to one worker and not finished."""
LONG_JOB_S = 0.05
"""Nothing is queued behind a job expected to take longer: the wake-up it would save is
under 0.2% of such a job, and the job behind it could wait for it."""
LONG_AFTER_MIN_S = 0.02
"""A running job is long once it ran 4× its topic's service time, and at least this long:
then the jobs queued behind it are taken back."""
UNKNOWN_SERVICE_S = 1.0
"""A topic not measured yet counts as long: nothing queued behind it until it is known."""


@dataclass
class Demand:
    """How many more jobs the workers of each group can take now, how many of them have
    nothing queued, and how many workers there are."""

    free: dict[Group, int]
    idle: dict[Group, int]
    workers: dict[Group, int]


class Dispatcher:
    """Sends buffered jobs to the workers' queues and applies what workers report."""

    def __init__(
        self,
        kinds: Registry,
        producer: Producer,
        completer: Completer,
        holdings: Holdings,
        metrics: prom.Metrics,
        default_grace_s: float,
        workers: Callable[[], Iterable[ChildProcess]],
    ) -> None:
        self.kinds, self.producer, self.completer = kinds, producer, completer
        self.holdings, self.metrics = holdings, metrics
        self.default_grace_s = default_grace_s
        self.workers = workers
        self.service: dict[str, float] = {}
        """Seconds a job of each topic takes in its worker (a moving average)."""
        self.seq = 0

    # --- sending ------------------------------------------------------------------------------

    def run_once(self, now: float) -> int:
        """Watch every worker's queue: take back what waits behind a long job, top the queues
        up from the buffers, and write every worker's messages at once; how many went out."""
        sent = 0
        for child in self.workers():
            child.observe()
            if self.running_long(child, now):
                self.take_back(child, now)
            elif child.open and not self.completer.full:  # backpressure: let the db catch up
                sent += self.top_up(child, now)
            child.flush()
        return sent

    def top_up(self, child: ChildProcess, now: float) -> int:
        """Send ``child`` jobs until its queue holds enough expected work; how many.

        The worker's board gets the earliest lease end of what it holds (a worker
        with nothing queued holds only what goes out now)."""
        sent = 0
        until = float("inf") if not child.queue else child.lease_until
        while len(child.queue) < MAX_QUEUED:
            claimed = self.producer.peek(child.group)
            if claimed is None or (child.queue and not self.fits_behind(child, claimed)):
                break
            self.producer.take(child.group)
            self.seq += 1
            try:
                child.assign(self.running(claimed, self.seq, now))
            except protocol.FrameTooLarge:
                self.too_large(claimed, now)
                continue
            if (held := self.holdings.get(claimed.id)) is not None:
                until = min(until, held.lease_end)
            sent += 1
        if sent and until != child.lease_until and until != float("inf"):
            child.post_lease(until)
        return sent

    def post_leases(self) -> None:
        """A heartbeat renewed leases: post on every worker's board the earliest lease end of
        the jobs it holds (one no longer held keeps the end last posted)."""
        holdings = self.holdings.jobs
        for child in self.workers():
            ends = [h.lease_end for r in child.queue if (h := holdings.get(r.claimed.id))]
            if ends:
                child.post_lease(min(ends))

    def too_large(self, claimed: Claimed, now: float) -> None:
        """A job whose payload cannot reach a worker: dead at once, with a reason (running it
        again cannot help); no worker is disturbed."""
        size = len(claimed.payload_text.encode("utf-8", "surrogatepass"))
        error = (
            f"PayloadTooLarge: {size} bytes is more than a worker can be sent "
            f"({protocol.MAX_PAYLOAD_BYTES} bytes); the payload was stored before "
            "QUEUE_MAX_PAYLOAD_BYTES bounded it, or by hand"
        )
        outcome = Outcome(SettleKind.DEAD, "dead", error=error)
        self.completer.add(claimed.ticket, outcome, claimed.topic, now)
        event(log, "JobDead", logging.WARNING, job_id=claimed.id, topic=claimed.topic, error=error)

    def fits_behind(self, child: ChildProcess, claimed: Claimed) -> bool:
        """Whether ``claimed`` may wait in ``child``'s queue behind the jobs already there
        (never without a board: a job queued there could not be taken back)."""
        if child.board is None or claimed.topic in self.producer.limits:
            return False  # a capped job (max_running) waits for an idle worker, anywhere
        head = self.expected(child.queue[0].claimed.topic)
        if head > LONG_JOB_S or self.expected(claimed.topic) > LONG_JOB_S:
            return False
        behind = sum(self.expected(r.claimed.topic) for r in list(child.queue)[1:])
        return behind < HORIZON_S

    def expected(self, topic: str) -> float:
        """The seconds a job of ``topic`` is expected to take."""
        return self.service.get(topic, UNKNOWN_SERVICE_S)

    def running_long(self, child: ChildProcess, now: float) -> bool:
        """True when jobs wait behind a running job that ran longer than expected."""
        deadline = self.long_at(child)
        return deadline is not None and now >= deadline

    def long_at(self, child: ChildProcess) -> float | None:
        """When the running job of ``child`` counts as long, if jobs wait behind it."""
        if len(child.queue) < 2 or child.board is None:
            return None
        head = child.queue[0]
        since = head.started if head.started is not None else head.sent
        return since + max(LONG_AFTER_MIN_S, 4 * self.expected(head.claimed.topic))

    def slack(self, now: float) -> float:
        """How long every worker can go on without the parent: the least expected work left
        in a queue (0 when some worker waits for a job)."""
        least = float("inf")
        for child in self.workers():
            if not child.open:
                continue
            if not child.queue:
                return 0.0
            head = child.queue[0]
            left = sum(self.expected(r.claimed.topic) for r in child.queue)
            if head.started is not None:
                left -= now - head.started
            least = min(least, left)
        return 0.0 if least == float("inf") else max(0.0, least)

    def deadlines(self) -> list[float]:
        """When a worker's watchdog may fire, or a queue behind a running job may be due back."""
        out = []
        for child in self.workers():
            if child.job and (due := child.job.next_deadline()):
                out.append(due)
            if (long_at := self.long_at(child)) is not None:
                out.append(long_at)
        return out

    def take_back(self, child: ChildProcess, now: float) -> list[Running]:
        """Take back the jobs ``child`` has not started (first in line in the buffer again);
        those taken back (none when the worker's board was busy: the next tick tries)."""
        if child.board is None or not child.queue:
            return []
        started = child.board.take_back(child.last_seq)
        if started is None:
            return []
        back = [r for r in child.queue if r.seq > started]
        child.queue = deque(r for r in child.queue if r.seq <= started)
        for r in reversed(back):
            self.producer.put_back(child.group, r.claimed, now)
        return back

    def demand(self) -> Demand:
        """Jobs the workers of each group can take now (for the producer's claims)."""
        free: dict[Group, int] = {}
        idle: dict[Group, int] = {}
        workers: dict[Group, int] = {}
        for child in self.workers():
            workers[child.group] = workers.get(child.group, 0) + 1
            if child.open:
                free[child.group] = free.get(child.group, 0) + self.room(child)
                idle[child.group] = idle.get(child.group, 0) + (not child.queue)
        return Demand(free, idle, workers)

    def room(self, child: ChildProcess) -> int:
        """How many more jobs ``child`` would take if its group's buffer were full."""
        topics = child.group
        each = max((self.expected(t) for t in topics), default=UNKNOWN_SERVICE_S)
        ahead = (
            0
            if each > LONG_JOB_S or child.board is None
            else min(MAX_QUEUED - 1, math.ceil(HORIZON_S / each))
        )
        return max(0, 1 + ahead - len(child.queue))

    def options(self, claimed: Claimed) -> KindOptions:
        """The complete options of a claimed job: its kind's (the defaults for a topic with
        no handler), with the overrides the job carries."""
        return self.kinds.job_options(claimed.topic, claimed.overrides)

    def running(self, claimed: Claimed, seq: int, now: float) -> Running:
        """The record of a job going out to a worker, with the watchdog's limits."""
        options = self.options(claimed)
        grace = (
            options.watchdog_grace.total_seconds()
            if options.watchdog_grace
            else self.default_grace_s
        )
        hard, soft = options.max_execution_timeout, options.attempt_timeout
        return Running(
            claimed,
            seq,
            now,
            grace,
            hard.total_seconds() if hard else None,
            soft.total_seconds() if soft else None,
        )

    def retire(self, child: ChildProcess) -> None:
        """The worker starts nothing more: what it has not started goes back to the buffer,
        it finishes its running job (if any) and leaves."""
        now = time.monotonic()
        child.retiring, child.retired_at = True, now
        self.take_back(child, now)
        if not child.stop_sent:
            child.stop_sent = True
            child.send(protocol.Stop())

    # --- reading ------------------------------------------------------------------------------

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

    def finished(self, child: ChildProcess, msg: protocol.Finished, now: float) -> None:
        """A worker is done with a job: queue or count the outcome; when the worker leaves,
        what it will not start goes back to the buffer."""
        job = next((r for r in child.queue if r.seq == msg.seq), None)
        if job is None or job.claimed.ticket != msg.ticket:
            return
        child.queue.remove(job)
        child.finished_jobs += 1
        topic, job_id = job.claimed.topic, msg.ticket.job_id
        self.measured(topic, msg.duration_s)
        self.producer.finished(child.group, now)
        if msg.written is not None or msg.outcome.kind is SettleKind.ABANDON:
            self.holdings.drop(job_id)
            if msg.written:
                self.metrics.settled.labels(topic=topic, outcome=msg.outcome.label).inc()
            elif msg.written is False:
                self.metrics.lease_lost.labels(topic=topic).inc()
        elif job_id in self.holdings:
            self.completer.add(msg.ticket, msg.outcome, topic, now)
        if msg.leaving is not None:
            child.leaving = msg.leaving  # it starts nothing more: its queue comes back now
            for r in reversed(child.queue):
                self.producer.put_back(child.group, r.claimed, now)
            child.queue.clear()

    def measured(self, topic: str, seconds: float) -> None:
        """Fold one job's duration into its topic's service time."""
        seconds = max(seconds, 1e-5)
        known = self.service.get(topic)
        self.service[topic] = seconds if known is None else known + (seconds - known) / 8

    # --- finding and stopping a job -----------------------------------------------------------

    def withdraw(self, job_id: str) -> Claimed | None:
        """Remove ``job_id`` wherever it waits unstarted (the buffer, a worker's queue);
        what was removed, or None (it runs, or it is not here)."""
        if (claimed := self.producer.drop(job_id)) is not None:
            return claimed
        for child in self.workers():
            if any(r.claimed.id == job_id and r.started is None for r in child.queue):
                if any(r.claimed.id == job_id for r in self.take_back(child, time.monotonic())):
                    return self.producer.drop(job_id)
                return None
        return None

    def running_child(self, job_id: str) -> ChildProcess | None:
        """The worker running ``job_id`` now, if any (its board read afresh)."""
        for child in self.workers():
            child.observe()
            job = child.job
            if job is not None and job.claimed.id == job_id:
                return child
        return None

    def interrupt(self, child: ChildProcess, reason: Interrupt, note: str) -> None:
        """Raise an Interrupted in the handler running now; the watchdog kills it after the
        grace. The board names the job first, so the signal never hits the next one."""
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
        if child.board is not None:
            child.board.post_interrupt(job.seq, CODE_OF.get(reason, 1))
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, SIGNAL_OF.get(reason, signal.SIGUSR1))
