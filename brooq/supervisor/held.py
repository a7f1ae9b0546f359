"""What becomes of the jobs a supervisor holds between claim and settle.

Claimed jobs are held (and heartbeated) until their outcome is written or
they are released; a job the database no longer lets us hold (canceled,
reaped, or its lease about to end while heartbeats fail) is interrupted
wherever it is: dropped from the buffer, or its handler interrupted and,
if need be, its worker killed before the lease can end.

HeldJobs is built from what it touches: the holdings, the metrics, the
writes lane and its store, and four callbacks into the dispatch (take a job
back from wherever it waits unstarted, which worker runs a job, interrupt
it, kill it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from brooq import metrics as prom
from brooq.engine.store import Claimed, ClaimedBatch, Store
from brooq.logs import event
from brooq.supervisor.children import ChildProcess, Interrupt, Kill
from brooq.supervisor.completer import Pending, count_by_label
from brooq.supervisor.database import Database
from brooq.supervisor.leases import Held, Holdings

log = logging.getLogger("brooq.supervisor")

REPORT_GRACE_S = 0.5
"""How long a worker's report that it settled a job itself may trail the row's commit."""


class HeldJobs:
    """The supervisor's callbacks for claimed, written, lost and released jobs."""

    def __init__(
        self,
        *,
        holdings: Holdings,
        metrics: prom.Metrics,
        writes: Database,
        store: Store,
        withdraw: Callable[[str], Claimed | None],
        running: Callable[[str], ChildProcess | None],
        interrupt: Callable[[ChildProcess, Interrupt, str], None],
        kill: Callable[[ChildProcess, Kill], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.holdings, self.metrics = holdings, metrics
        self.writes, self.store = writes, store
        self.withdraw, self.running = withdraw, running
        self.interrupt, self.kill = interrupt, kill
        self.clock = clock
        self.suspects: dict[str, tuple[Held, float]] = {}
        """Jobs a heartbeat did not find ours, whose worker may yet report them settled."""

    def claimed(self, claimed: list[Claimed], lease_end: float) -> None:
        """The producer claimed jobs: hold them, count them (and the claims a rate limit
        cut short)."""
        topics: dict[str, int] = {}
        for c in claimed:
            self.holdings.add(c.ticket, c.topic, lease_end)
            topics[c.topic] = topics.get(c.topic, 0) + 1
        for topic, n in topics.items():
            self.metrics.claimed.labels(topic=topic).inc(n)
        if isinstance(claimed, ClaimedBatch):
            for topic in claimed.rate_limited:
                self.metrics.rate_limited.labels(topic=topic).inc()

    def flushed(self, written: list[Pending], lost: list[Pending]) -> None:
        """The completer wrote outcomes: count them; those no longer held lost their lease."""
        for p in written + lost:
            self.holdings.drop(p.ticket.job_id)
        for (topic, label), n in count_by_label(written).items():
            self.metrics.settled.labels(topic=topic, outcome=label).inc(n)
        for p in lost:
            self.metrics.lease_lost.labels(topic=p.topic).inc()
            event(
                log,
                "LeaseLost",
                logging.WARNING,
                job_id=p.ticket.job_id,
                topic=p.topic,
                outcome=p.outcome.label,
                note="outcome not written: the lease was lost",
            )

    def lost(self, held: Held) -> None:
        """A heartbeat did not find a job ours any more (canceled, or reaped and taken)."""
        job_id = held.ticket.job_id
        self.holdings.drop(job_id)
        if self.withdraw(job_id) is not None:
            return
        # A worker that settles a job with effects itself writes the row before its
        # report reaches us: give the report a moment before calling the lease lost.
        self.suspects[job_id] = (held, self.clock() + REPORT_GRACE_S)

    def confirm_lost(self, now: float) -> None:
        """Interrupt the handlers of lost jobs whose workers did not report them settled."""
        for job_id, (held, due) in list(self.suspects.items()):
            child = self.running(job_id)
            if child is not None and now < due:
                continue  # its report, if any, is read with every other in read_workers
            del self.suspects[job_id]
            if child is not None and child.job and child.job.claimed.ticket == held.ticket:
                self.metrics.lease_lost.labels(topic=held.topic).inc()
                self.interrupt(child, Interrupt.LEASE_LOST, "interrupting the handler")

    def canceled(self, job_id: str) -> None:
        """A job was canceled: out of the buffer or a worker's queue, or its handler
        interrupted."""
        if self.withdraw(job_id) is not None:
            self.holdings.drop(job_id)
            return
        child = self.running(job_id)
        if child is not None:
            self.interrupt(child, Interrupt.CANCELED, "interrupting the handler")

    def expiring(self, held: Iterable[Held], now: float, lease_s: float) -> None:
        """Heartbeats fail and ``held`` may lose their lease soon: stop each job before its
        lease can end (out of the buffer, or interrupt its handler, then kill its worker)."""
        for h in held:
            if self.withdraw(h.ticket.job_id) is not None:
                self.holdings.drop(h.ticket.job_id)
                continue
            child = self.running(h.ticket.job_id)
            if child is None:
                continue
            self.interrupt(
                child,
                Interrupt.LEASE_LOST,
                "the database did not answer heartbeats; the lease ends soon",
            )
            if h.lease_end - now <= min(1.0, lease_s / 6) and child.kill is None:
                self.kill(child, Kill.LEASE_ENDING)

    def release(self, claimed: list[Claimed], why: str) -> None:
        """Give jobs back to pending, uncharged (a task of the writes lane)."""
        if not claimed:
            return
        tickets = [c.ticket for c in claimed]
        for c in claimed:
            self.holdings.drop(c.id)

        def done(released: set[str] | None, error: BaseException | None) -> None:
            for job_id in sorted(released or ()):
                event(log, "JobReleased", job_id=job_id, note=why)

        store = self.store
        self.writes.submit("release", lambda: store.release(tickets), done)
