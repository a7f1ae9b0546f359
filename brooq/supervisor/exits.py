"""What the supervisor does when one of its workers is gone.

The job it held meets the fate the orphans service decides (recorded
failure, uncharged release, back into the buffer, or left alone); the slot
backs off when its workers die at boot; the exit is counted and logged.
Exits is built from what it touches: the kind options, the completer, the
producer, the holdings, a release callback and a restart counter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from brooq import osproc
from brooq.engine.outcome import Outcome
from brooq.engine.store import Claimed
from brooq.logs import event
from brooq.supervisor import orphans
from brooq.supervisor.children import ChildProcess, Exit, Running
from brooq.supervisor.completer import Completer
from brooq.supervisor.leases import Holdings
from brooq.supervisor.producer import Producer
from brooq.supervisor.slots import SlotState
from brooq.vocabulary import KindOptions

log = logging.getLogger("brooq.supervisor")

STABLE_AFTER_S = 10.0
"""A worker that crashes sooner than this after its start counts toward its slot's backoff."""
QUIET_EXITS = (Exit.STOPPED, Exit.MAX_JOBS, Exit.MAX_MEMORY, Exit.RELOAD)
"""Exits that are part of normal operation: logged at INFO."""

Release = Callable[[list[Claimed], str], None]
"""Gives jobs back to ``pending``, uncharged, saying why."""


class Exits:
    """Settles what dead workers leave behind."""

    def __init__(
        self,
        *,
        options: Callable[[Claimed], KindOptions],
        completer: Completer,
        producer: Producer,
        holdings: Holdings,
        release: Release,
        restarted: Callable[[Exit], None],
        lease_s: float = 0.0,
        crashed: Callable[[Claimed, Outcome, float | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options, self.completer, self.producer = options, completer, producer
        self.holdings, self.release, self.restarted = holdings, release, restarted
        self.lease_s = lease_s
        self.clock = clock
        self.crashed = crashed
        """Tells the middleware of an attempt whose worker died (their ``settled`` hooks)."""
        self.restarts = 0

    def worker_exited(
        self,
        child: ChildProcess,
        status: int,
        *,
        generation: int,
        stopping: bool,
        slot: SlotState | None,
    ) -> Exit:
        """Settle the jobs a dead worker held (the one it ran; those it never started go
        back); count and log why it is gone; the reason.

        ``slot`` is the slot the worker filled, None when that slot is gone
        (TTOU); the caller has read the worker's last messages first.
        """
        child.close()
        child.observe()  # its board says which job it started last
        how = osproc.describe_exit(status)
        lease_ended = orphans.left_as_lease_ended(child, status, self.clock(), self.lease_s)
        reason = orphans.exit_reason(child, status, generation, stopping, lease_ended)
        running = child.job
        unstarted = [r.claimed for r in child.queue if r is not running]
        if running is not None:
            self.orphaned(child, running, status, how, stopping, lease_ended)
        if unstarted:
            self.give_back(child, unstarted, stopping)
        if slot is not None and not stopping:
            self.slot_backoff(child, slot, status, how, bool(child.queue))
        child.queue.clear()
        if reason not in (Exit.STOPPED, Exit.SHUTDOWN):
            self.restarts += 1
            self.restarted(reason)
        event(
            log,
            "WorkerExited",
            logging.INFO if reason in QUIET_EXITS else logging.WARNING,
            slot=child.slot,
            pid=child.pid,
            exit=how,
            reason=str(reason),
        )
        return reason

    def give_back(self, child: ChildProcess, unstarted: list[Claimed], stopping: bool) -> None:
        """Jobs the worker never started: another worker takes them, or (stopping) they go
        back to pending, uncharged."""
        if stopping:
            self.release(unstarted, "stopping")
            return
        now = self.clock()
        for claimed in reversed(unstarted):
            self.producer.put_back(child.group, claimed, now)

    def orphaned(
        self,
        child: ChildProcess,
        job: Running,
        status: int,
        how: str,
        stopping: bool,
        lease_ended: bool = False,
    ) -> None:
        """Carry out the orphans service's decision about the job ``child`` was running."""
        claimed = job.claimed
        options = self.options(claimed)
        orphan = orphans.decide_orphan(child, job, status, how, options, lease_ended)
        match orphan.fate:
            case orphans.Fate.RELEASE:
                self.release([claimed], "shutdown")
            case orphans.Fate.PUT_BACK:
                self.give_back(child, [claimed], stopping)
            case orphans.Fate.RECORD if orphan.outcome is not None:
                self.completer.add(claimed.ticket, orphan.outcome, claimed.topic, self.clock())
                event(
                    log,
                    "JobDead" if orphan.outcome.label == "dead" else "JobFailed",
                    logging.WARNING,
                    job_id=claimed.id,
                    topic=claimed.topic,
                    attempt=claimed.attempt,
                    outcome=orphan.outcome.label,
                    error=orphan.outcome.error,
                )
                if self.crashed is not None:
                    self.crashed(claimed, orphan.outcome, job.started)
            case _:
                self.holdings.drop(claimed.id)

    def slot_backoff(
        self, child: ChildProcess, slot: SlotState, status: int, how: str, held_a_job: bool
    ) -> None:
        """A worker that died at boot, or soon after without any job to blame, starts again
        only after a backoff (a job that kills its worker is charged for it instead)."""
        now = self.clock()
        if (
            orphans.planned(status)
            or child.kill is not None
            or held_a_job
            or child.finished_jobs
            or now - child.started >= STABLE_AFTER_S
        ):
            slot.booted()
            return
        delay = slot.boot_failed(now)
        event(
            log,
            "WorkerBootFailed" if not child.booted else "WorkerCrashLoop",
            logging.ERROR,
            slot=child.slot,
            pid=child.pid,
            exit=how,
            retry_in_s=delay,
        )
