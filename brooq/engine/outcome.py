"""The retry decision: what an attempt's result means for the job. Pure, no I/O."""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from brooq.engine.backoff import backoff
from brooq.vocabulary import (
    CancelJob,
    Delay,
    Interrupted,
    InvalidJob,
    JobCanceledWhileRunning,
    KindOptions,
    LeaseLost,
    PreserveAttempt,
    State,
    find_signal,
)

LAST_ERROR_MAX_CHARS = 2000
LAST_TRACEBACK_MAX_CHARS = 16_000


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
    ``traceback`` goes into ``last_traceback``; ``label`` names the outcome
    for logs and metrics (done, failed, dead, canceled, delayed, preserved,
    abandoned); ``result`` is the JSON text of what the handler returned
    (DONE only; None when it returned nothing).
    """

    kind: SettleKind
    label: str
    retry_in: timedelta | None = None
    refund_attempt: bool = False
    error: str | None = None
    traceback: str | None = None
    result: str | None = None

    @property
    def state(self) -> State | None:
        """The state written, or None when nothing is written."""
        return None if self.kind is SettleKind.ABANDON else State(self.kind.value)


DONE = Outcome(SettleKind.DONE, "done")


def safe_text(text: str) -> str:
    """``text`` that PostgreSQL and any log can take: lone surrogates as ``\\udcff``,
    NUL as ``\\0``."""
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean_reason(reason: str) -> str:
    """A cancel reason as every store writes it: at most LAST_ERROR_MAX_CHARS.

    Raises InvalidJob for what PostgreSQL cannot store as text (a lone
    surrogate, a NUL character): the caller's input, refused before anything
    is written.
    """
    if not isinstance(reason, str):
        raise InvalidJob(f"a cancel reason must be a string, not {type(reason).__name__}")
    if "\x00" in reason:
        raise InvalidJob("the cancel reason holds a NUL character, which PostgreSQL rejects")
    if not reason.isprintable() and any("\ud800" <= c <= "\udfff" for c in reason):
        raise InvalidJob("the cancel reason holds a lone surrogate, which is not valid UTF-8")
    return bounded(reason, LAST_ERROR_MAX_CHARS)


def describe_error(error: BaseException) -> str:
    """``Type: message``, bounded to LAST_ERROR_MAX_CHARS, for the ``last_error`` column.

    Never raises: an exception whose ``__str__`` fails (even with a
    BaseException) is described by its type alone.
    """
    try:
        message = str(error).strip()
    except BaseException:  # a broken __str__ must not turn a failure into a crash
        message = "<exception str() failed>"
    name = type(error).__name__
    return bounded(safe_text(f"{name}: {message}" if message else name), LAST_ERROR_MAX_CHARS)


def format_traceback(error: BaseException) -> str | None:
    """The traceback of ``error`` (its chain included), bounded, for ``last_traceback``."""
    if error.__traceback__ is None and error.__cause__ is None and error.__context__ is None:
        return None
    try:
        text = "".join(traceback.format_exception(error))
    except BaseException:
        return None
    # Keep the end: the innermost frames say where it failed.
    if len(text) > LAST_TRACEBACK_MAX_CHARS:
        text = "…" + text[-(LAST_TRACEBACK_MAX_CHARS - 1) :]
    return safe_text(text)


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
    error_text, trace = describe_error(signal), format_traceback(error)
    match signal:
        case LeaseLost() | JobCanceledWhileRunning():
            return Outcome(SettleKind.ABANDON, "abandoned", error=error_text)
        case CancelJob():
            return Outcome(SettleKind.CANCELED, "canceled", error=error_text, traceback=trace)
        case PreserveAttempt():
            delay = backoff(attempt, base, cap, rand)
            return Outcome(
                SettleKind.FAILED,
                "preserved",
                delay,
                refund_attempt=True,
                error=error_text,
                traceback=trace,
            )
        case Delay() if not last:
            return Outcome(
                SettleKind.FAILED,
                "delayed",
                min(signal.delay, cap),
                error=error_text,
                traceback=trace,
            )
        case _ if last:
            return Outcome(SettleKind.DEAD, "dead", error=error_text, traceback=trace)
        case _:
            return Outcome(
                SettleKind.FAILED,
                "failed",
                backoff(attempt, base, cap, rand),
                error=error_text,
                traceback=trace,
            )


def crash_outcome(reason: str, attempt: int, options: KindOptions) -> Outcome:
    """The recorded failure of an attempt whose process died (exit code or signal in ``reason``)."""
    return decide(WorkerCrashed(reason), attempt, options)


class WorkerCrashed(Exception):
    """The process running the handler died; the supervisor records it as a failure."""


__all__ = ["DONE", "Interrupted", "Outcome", "SettleKind", "crash_outcome", "decide"]
