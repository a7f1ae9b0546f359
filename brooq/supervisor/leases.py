"""Every job the supervisor holds, and the heartbeat that keeps their leases.

A job is held from its claim until its outcome is written (or it is
released): while it waits in a buffer, while a worker runs it, and while its
outcome waits for the completer. One heartbeat statement every lease/3
extends them all. The supervisor knows, by its own clock, a conservative end
of each lease (when the statement that set it was sent, plus the lease): if
heartbeats cannot get through, a running job is interrupted and then killed
before that end, so that another supervisor's reaper never hands out a job
that still runs here. Each worker is told that end too (its board) and stops
its handler before it on its own, should the supervisor itself stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

from brooq.engine.store import Store, Ticket
from brooq.engine.timer import Every
from brooq.supervisor.database import Database

log = logging.getLogger("brooq.supervisor")

RETRY_S = 1.0
"""After a failed heartbeat (its connection cut as stuck, an outage) the next one is sent this
soon, not a whole lease/3 later: one lost statement must not bring the leases to their end."""


@dataclass
class Held:
    """A job this supervisor holds, and when its lease surely still holds until."""

    ticket: Ticket
    topic: str
    lease_end: float
    """Monotonic seconds: the lease is held at least until then."""


class Holdings:
    """The jobs held by one supervisor, by id."""

    def __init__(self) -> None:
        self.jobs: dict[str, Held] = {}
        self.earliest_end = float("inf")
        """No held lease ends before this: a lower bound (leases only get added or longer)."""

    def add(self, ticket: Ticket, topic: str, lease_end: float) -> None:
        """Start holding a job just claimed."""
        self.jobs[ticket.job_id] = Held(ticket, topic, lease_end)
        self.earliest_end = min(self.earliest_end, lease_end)

    def drop(self, job_id: str) -> Held | None:
        """Stop holding a job (written, released, lost); what was held."""
        return self.jobs.pop(job_id, None)

    def get(self, job_id: str) -> Held | None:
        """The held job with this id, if any."""
        return self.jobs.get(job_id)

    def tickets(self) -> list[Ticket]:
        """The tickets of every held job."""
        return [h.ticket for h in self.jobs.values()]

    def extend(self, ids: Iterable[str], lease_end: float) -> None:
        """Record a successful heartbeat of ``ids``."""
        for job_id in ids:
            held = self.jobs.get(job_id)
            if held is not None:
                held.lease_end = max(held.lease_end, lease_end)

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.jobs


class LeaseKeeper:
    """The heartbeat: one statement for every held job, every lease/3."""

    def __init__(
        self,
        store: Store,
        db: Database,
        holdings: Holdings,
        lease: timedelta,
        on_lost: Callable[[Held], None],
        on_kept: Callable[[], None] = lambda: None,
    ) -> None:
        self.store, self.db, self.holdings = store, db, holdings
        self.lease = lease
        self.every = Every(lease / 3)
        self.on_lost = on_lost
        self.on_kept = on_kept
        """Called after each heartbeat that got through (the workers learn the new ends)."""
        self.failed = False

    def run_once(self, now: float) -> bool:
        """Send a heartbeat when one is due and none is under way; True if sent."""
        if self.db.busy("heartbeat"):
            return False
        if self.failed:  # the leases stand until their end (see expiring()): try again soon
            self.failed = False
            self.every.retry_within(now, RETRY_S)
        if not self.every.due(now):
            return False
        tickets = self.holdings.tickets()
        if not tickets:
            return False
        lease_end = now + self.lease.total_seconds()

        def done(kept: set[str] | None, error: BaseException | None) -> None:
            if error is not None or kept is None:
                self.failed = True
                return
            self.holdings.extend(kept, lease_end)
            for ticket in tickets:
                held = self.holdings.get(ticket.job_id)
                if ticket.job_id not in kept and held is not None and held.ticket == ticket:
                    self.on_lost(held)
            self.on_kept()

        self.db.submit("heartbeat", lambda: self.store.heartbeat(tickets, self.lease), done)
        return True

    def expiring(self, now: float, within: float) -> list[Held]:
        """Held jobs whose lease may end within ``within`` seconds (heartbeats are failing)."""
        holdings = self.holdings
        if now + within < holdings.earliest_end:
            return []  # every tick asks: spare it a walk over every held job
        out = [h for h in holdings.jobs.values() if h.lease_end - now <= within]
        if not out:
            holdings.earliest_end = min(
                (h.lease_end for h in holdings.jobs.values()), default=float("inf")
            )
        return out
