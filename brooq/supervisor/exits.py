"""What the supervisor does when one of its workers is gone.

The job it held meets the fate the orphans service decides (recorded
failure, uncharged release, back into the buffer, or left alone); the slot
backs off when its workers die at boot; the exit is counted and logged.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from brooq import osproc
from brooq.logs import event
from brooq.supervisor import orphans
from brooq.supervisor.children import ChildProcess, Exit

if TYPE_CHECKING:
    from brooq.supervisor.arbiter import Supervisor

log = logging.getLogger("brooq.supervisor")

STABLE_AFTER_S = 10.0
"""A worker that crashes sooner than this after its start counts toward its slot's backoff."""
QUIET_EXITS = (Exit.STOPPED, Exit.MAX_JOBS, Exit.MAX_MEMORY, Exit.RELOAD)
"""Exits that are part of normal operation: logged at INFO."""


class Exits:
    """Settles what dead workers leave behind, on behalf of one supervisor."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.restarts = 0

    def worker_exited(self, child: ChildProcess, status: int) -> None:
        """Settle the job a dead worker held; count and log why it is gone."""
        sup = self.sup
        sup.read_worker(child, time.monotonic())
        child.close()
        how = osproc.describe_exit(status)
        reason = orphans.exit_reason(child, status, sup.generation, bool(sup.stopping))
        held_a_job = child.job is not None
        if held_a_job:
            self.orphaned(child, status, how)
        self.slot_backoff(child, status, how, held_a_job)
        if reason not in (Exit.STOPPED, Exit.SHUTDOWN):
            self.restarts += 1
            sup.metrics.restarts.labels(reason=str(reason)).inc()
        event(
            log,
            "WorkerExited",
            logging.INFO if reason in QUIET_EXITS else logging.WARNING,
            slot=child.slot,
            pid=child.pid,
            exit=how,
            reason=str(reason),
        )

    def orphaned(self, child: ChildProcess, status: int, how: str) -> None:
        """Carry out the orphans service's decision about the job ``child`` held."""
        sup, job = self.sup, child.job
        assert job is not None
        claimed = job.claimed
        orphan = orphans.decide_orphan(
            child, job, status, how, sup.dispatcher.options(claimed.topic)
        )
        match orphan.fate:
            case orphans.Fate.RELEASE:
                sup.release([claimed], "shutdown")
            case orphans.Fate.PUT_BACK if not sup.stopping:
                sup.producer.put_back(child.group, claimed, time.monotonic())
            case orphans.Fate.PUT_BACK:
                sup.release([claimed], "stopping")
            case orphans.Fate.RECORD if orphan.outcome is not None:
                sup.completer.add(claimed.ticket, orphan.outcome, claimed.topic, time.monotonic())
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
            case _:
                sup.holdings.drop(claimed.id)

    def slot_backoff(self, child: ChildProcess, status: int, how: str, held_a_job: bool) -> None:
        """A worker that died at boot, or soon after without any job to blame, starts again
        only after a backoff (a job that kills its worker is charged for it instead)."""
        sup = self.sup
        if child.slot >= len(sup.slots) or sup.stopping:
            return
        slot = sup.slots[child.slot]
        lived = time.monotonic() - child.started
        if (
            orphans.planned(status)
            or child.kill is not None
            or held_a_job
            or child.finished_jobs
            or lived >= STABLE_AFTER_S
        ):
            slot.booted()
            return
        delay = slot.boot_failed(time.monotonic())
        event(
            log,
            "WorkerBootFailed" if not child.booted else "WorkerCrashLoop",
            logging.ERROR,
            slot=child.slot,
            pid=child.pid,
            exit=how,
            retry_in_s=delay,
        )
