"""What becomes of the jobs a supervisor holds between claim and settle.

Claimed jobs are held (and heartbeated) until their outcome is written or
they are released; a job the database no longer lets us hold (canceled,
reaped, or its lease about to end while heartbeats fail) is interrupted
wherever it is: dropped from the buffer, or its handler interrupted and,
if need be, its worker killed before the lease can end.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from brooq.engine.store import Claimed
from brooq.logs import event
from brooq.supervisor.children import Interrupt, Kill
from brooq.supervisor.completer import Pending, count_by_label
from brooq.supervisor.leases import Held

if TYPE_CHECKING:
    from brooq.supervisor.arbiter import Supervisor

log = logging.getLogger("brooq.supervisor")

REPORT_GRACE_S = 0.5
"""How long a worker's report that it settled a job itself may trail the row's commit."""


class HeldJobs:
    """The supervisor's callbacks for claimed, written, lost and released jobs."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.suspects: dict[str, tuple[Held, float]] = {}
        """Jobs a heartbeat did not find ours, whose worker may yet report them settled."""

    def claimed(self, claimed: list[Claimed], lease_end: float) -> None:
        """The producer claimed jobs: hold them, count them."""
        topics: dict[str, int] = {}
        for c in claimed:
            self.sup.holdings.add(c.ticket, c.topic, lease_end)
            topics[c.topic] = topics.get(c.topic, 0) + 1
        for topic, n in topics.items():
            self.sup.metrics.claimed.labels(topic=topic).inc(n)

    def flushed(self, written: list[Pending], lost: list[Pending]) -> None:
        """The completer wrote outcomes: count them; those no longer held lost their lease."""
        sup = self.sup
        for p in written + lost:
            sup.holdings.drop(p.ticket.job_id)
        for (topic, label), n in count_by_label(written).items():
            sup.metrics.settled.labels(topic=topic, outcome=label).inc(n)
        for p in lost:
            sup.metrics.lease_lost.labels(topic=p.topic).inc()
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
        sup, job_id = self.sup, held.ticket.job_id
        sup.holdings.drop(job_id)
        if sup.producer.drop(job_id) is not None:
            return
        # A worker that settles a job with effects itself writes the row before its
        # report reaches us: give the report a moment before calling the lease lost.
        self.suspects[job_id] = (held, time.monotonic() + REPORT_GRACE_S)

    def confirm_lost(self, now: float) -> None:
        """Interrupt the handlers of lost jobs whose workers did not report them settled."""
        sup = self.sup
        for job_id, (held, due) in list(self.suspects.items()):
            child = sup.workers.running(job_id)
            if child is not None and now < due:
                continue  # its report, if any, is read with every other in read_workers
            del self.suspects[job_id]
            if child is not None and child.job and child.job.claimed.ticket == held.ticket:
                sup.metrics.lease_lost.labels(topic=held.topic).inc()
                sup.dispatcher.interrupt(child, Interrupt.LEASE_LOST, "interrupting the handler")

    def canceled(self, job_id: str) -> None:
        """A job was canceled: out of the buffer, or its handler interrupted."""
        sup = self.sup
        if sup.producer.drop(job_id) is not None:
            sup.holdings.drop(job_id)
        child = sup.workers.running(job_id)
        if child is not None:
            sup.dispatcher.interrupt(child, Interrupt.CANCELED, "interrupting the handler")

    def expiring(self, now: float, lease_s: float) -> None:
        """Heartbeats fail: stop each job before its lease can end (interrupt, then kill)."""
        sup = self.sup
        for held in sup.leases.expiring(now, within=lease_s / 3):
            child = sup.workers.running(held.ticket.job_id)
            if child is None:
                if sup.producer.drop(held.ticket.job_id) is not None:
                    sup.holdings.drop(held.ticket.job_id)
                continue
            sup.dispatcher.interrupt(
                child,
                Interrupt.LEASE_LOST,
                "the database did not answer heartbeats; the lease ends soon",
            )
            if held.lease_end - now <= min(1.0, lease_s / 6) and child.kill is None:
                sup.workers.kill(child, Kill.LEASE_ENDING)

    def release(self, claimed: list[Claimed], why: str) -> None:
        """Give jobs back to pending, uncharged (a database task)."""
        if not claimed:
            return
        sup = self.sup
        tickets = [c.ticket for c in claimed]
        for c in claimed:
            sup.holdings.drop(c.id)

        def done(released: set[str] | None, error: BaseException | None) -> None:
            for job_id in sorted(released or ()):
                event(log, "JobReleased", job_id=job_id, note=why)

        sup.db.writes.submit("release", lambda: sup.store.release(tickets), done)
