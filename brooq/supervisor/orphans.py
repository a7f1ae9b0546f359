"""What becomes of the job a worker held when it died: the orphans service.

A pure decision from how the worker ended; the supervisor carries it out.
A crash, a hard timeout or a hung handler is a recorded failure (invariant
7: this is how a poison job reaches ``dead``); a stop past the graceful
timeout gives the job back uncharged; a job the worker never started goes
back into the buffer; a job that was no longer ours (lease lost, canceled),
or whose worker left as its lease ended, is left alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum

from brooq.engine.outcome import Outcome, crash_outcome
from brooq.supervisor.child import ExitCode
from brooq.supervisor.children import ChildProcess, Exit, Interrupt, Kill, Running
from brooq.supervisor.leasewatch import Margins
from brooq.vocabulary import KindOptions


class Fate(Enum):
    """What to do with an orphaned job."""

    RECORD = "record"
    """Write ``outcome`` (a recorded failure) through the completer."""
    RELEASE = "release"
    """Give it back to ``pending``, uncharged."""
    PUT_BACK = "put_back"
    """It never started: another worker of this supervisor takes it."""
    LEAVE = "leave"
    """No longer ours (lease lost, canceled) or not writable now: write nothing."""


@dataclass(frozen=True, slots=True)
class Orphan:
    """The decision about one orphaned job."""

    fate: Fate
    outcome: Outcome | None = None


def planned(status: int) -> bool:
    """True when the worker exited on its own and on purpose (stopping, recycling)."""
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) in (
        ExitCode.OK,
        ExitCode.RECYCLE,
        ExitCode.STOPPED_IDLE,
    )


def left_as_lease_ended(child: ChildProcess, status: int, now: float, lease_s: float) -> bool:
    """True when the worker left on its own as the lease posted on its board was ending: its
    exit code says so and the parent's record of that lease agrees (a handler's own
    ``os._exit`` with the same code at any other time is a crash)."""
    return (
        os.WIFEXITED(status)
        and os.WEXITSTATUS(status) == ExitCode.LEASE_ENDING
        and child.lease_until > 0
        and now >= child.lease_until - Margins.of(lease_s).interrupt_s
    )


def exit_reason(
    child: ChildProcess, status: int, generation: int, stopping: bool, lease_ended: bool = False
) -> Exit:
    """Why the worker is gone, for logs and brooq_worker_restarts_total."""
    if child.kill is not None:
        return Exit(child.kill.value)
    if lease_ended:
        return Exit.LEASE_ENDING
    if child.leaving in (Exit.MAX_JOBS, Exit.MAX_MEMORY, Exit.BROKEN):
        return Exit(child.leaving)
    if child.retiring and planned(status):
        return Exit.RELOAD if generation > child.generation else Exit.STOPPED
    if (stopping or child.leaving == "stopping") and planned(status):
        return Exit.STOPPED
    return Exit.CRASH


def decide_orphan(
    child: ChildProcess,
    job: Running,
    status: int,
    how: str,
    options: KindOptions,
    lease_ended: bool = False,
) -> Orphan:
    """What to do with ``job``, held by ``child`` when it ended (``how``: its exit;
    ``lease_ended``: the worker left as its lease ended, see left_as_lease_ended)."""
    if child.kill is Kill.SHUTDOWN:
        return Orphan(Fate.RELEASE)
    if (
        lease_ended
        or child.kill is Kill.LEASE_ENDING
        or job.interrupted
        in (
            Interrupt.LEASE_LOST,
            Interrupt.CANCELED,
        )
    ):
        return Orphan(Fate.LEAVE)
    if (
        child.kill is None
        and os.WIFEXITED(status)
        and os.WEXITSTATUS(status) == ExitCode.STOPPED_IDLE
    ):
        return Orphan(Fate.PUT_BACK)  # it left before it read the job
    text = crash_text(child.kill, job, how)
    return Orphan(Fate.RECORD, crash_outcome(text, job.claimed.attempt, options))


def crash_text(kill: Kill | None, job: Running, how: str) -> str:
    """``last_error`` of an attempt whose process died."""
    if kill is Kill.MAX_EXECUTION:
        return f"max_execution_timeout exceeded; the supervisor killed the worker ({how})"
    if kill is Kill.HUNG and job.interrupted in (None, Interrupt.ATTEMPT_TIMEOUT):
        return (
            f"attempt timed out and the handler did not exit within {job.grace_s:g}s; "
            f"the supervisor killed the worker ({how})"
        )
    if kill is Kill.BROKEN:
        return (
            "the worker broke its connection to the supervisor while running the handler "
            f"(it closed a file descriptor it did not own?); the supervisor killed it ({how})"
        )
    if how == f"exited with code {int(ExitCode.LOST_PARENT)}":
        return (
            "the worker lost its connection to the supervisor while running the handler "
            f"(it closed a file descriptor it did not own?); worker process {how}"
        )
    return f"worker process {how} while running the handler"
