"""The retry decision: what an attempt's result means for the job. Pure, no I/O."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from brooq.engine.backoff import backoff
from brooq.vocabulary import (
    CancelJob,
    Delay,
    Interrupted,
    JobCanceledWhileRunning,
    KindOptions,
    LeaseLost,
    PreserveAttempt,
    State,
    find_signal,
)

LAST_ERROR_MAX_CHARS = 2000


class SettleKind(StrEnum):
    """What the settle writes: a final state or a retry."""

    DONE = "done"
    FAILED = "failed"
    DEAD = "dead"
    CANCELED = "canceled"
    ABANDON = "abandon"
    """Write nothing: the lease is lost or the job was canceled while running."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The decided result of one attempt, ready for the store to write.

    ``retry_in`` is set for FAILED; ``refund_attempt`` undoes the charge of
    this attempt (PreserveAttempt); ``error`` goes into ``last_error``;
    ``label`` names the outcome for logs and metrics (done, failed, dead,
    canceled, delayed, preserved, abandoned).
    """

    kind: SettleKind
    label: str
    retry_in: timedelta | None = None
    refund_attempt: bool = False
    error: str | None = None

    @property
    def state(self) -> State | None:
        """The state written, or None when nothing is written."""
        return None if self.kind is SettleKind.ABANDON else State(self.kind.value)


DONE = Outcome(SettleKind.DONE, "done")


def clean_reason(reason: str) -> str:
    """A cancel reason as every store writes it: NUL escaped (PostgreSQL rejects it),
    at most LAST_ERROR_MAX_CHARS."""
    return reason.replace("\x00", "\\0")[:LAST_ERROR_MAX_CHARS]


def describe_error(error: BaseException) -> str:
    """``Type: message``, bounded to LAST_ERROR_MAX_CHARS, for the ``last_error`` column."""
    try:
        message = str(error).strip()
    except Exception:  # a broken __str__ must not turn a failure into a crash
        message = "<exception str() failed>"
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    text = text.replace("\x00", "\\0")
    if len(text) > LAST_ERROR_MAX_CHARS:
        text = text[: LAST_ERROR_MAX_CHARS - 1] + "…"
    return text


def decide(
    error: BaseException | None,
    attempt: int,
    options: KindOptions,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """Turn an attempt's result into an Outcome. ``options`` must be complete (with defaults)."""
    if error is None:
        return DONE
    signal = find_signal(error)
    max_attempts = options.max_attempts or 1
    base = options.backoff_base or timedelta(seconds=1)
    cap = options.backoff_max or base
    last = attempt >= max_attempts
    match signal:
        case LeaseLost() | JobCanceledWhileRunning():
            return Outcome(SettleKind.ABANDON, "abandoned", error=describe_error(signal))
        case CancelJob():
            return Outcome(SettleKind.CANCELED, "canceled", error=describe_error(signal))
        case PreserveAttempt():
            delay = backoff(attempt, base, cap, rand)
            return Outcome(
                SettleKind.FAILED, "preserved", delay, refund_attempt=True,
                error=describe_error(signal),
            )
        case Delay() if not last:
            return Outcome(
                SettleKind.FAILED, "delayed", min(signal.delay, cap), error=describe_error(signal)
            )
        case _ if last:
            return Outcome(SettleKind.DEAD, "dead", error=describe_error(signal))
        case _:
            delay = backoff(attempt, base, cap, rand)
            return Outcome(SettleKind.FAILED, "failed", delay, error=describe_error(signal))


def crash_outcome(reason: str, attempt: int, options: KindOptions) -> Outcome:
    """The recorded failure of an attempt whose process died (exit code or signal in ``reason``)."""
    return decide(WorkerCrashed(reason), attempt, options)


class WorkerCrashed(Exception):
    """The process running the handler died; the supervisor records it as a failure."""


__all__ = ["DONE", "Interrupted", "Outcome", "SettleKind", "crash_outcome", "decide"]
