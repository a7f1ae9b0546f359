"""What a handler raises to steer its job, and the interrupts brooq raises into it.

Signals are found through ``__cause__`` and ``__context__`` too, so
``raise brooq.CancelJob("gone") from err`` works like a direct raise.
"""

from __future__ import annotations

from datetime import timedelta


class HandlerSignal(Exception):
    """Base class of the signals a handler raises on purpose."""


class Delay(HandlerSignal):
    """Retry later, after ``seconds`` (clamped to backoff max).

    Each Delay uses the attempt it ran in (the retry is the next attempt), so
    on the last attempt the job goes ``dead``; raise PreserveAttempt to wait
    without using one up.
    """

    def __init__(self, seconds: float | timedelta) -> None:
        delay = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        if delay < timedelta(0):
            raise ValueError(f"Delay must not be negative, got {delay}")
        super().__init__(f"delayed by handler for {delay.total_seconds():g}s")
        self.delay = delay


class PreserveAttempt(HandlerSignal):
    """This failure does not use up an attempt: the job retries with backoff, never ``dead``."""

    def __init__(self, reason: str = "attempt preserved by handler") -> None:
        super().__init__(reason)


class CancelJob(HandlerSignal):
    """The job is no longer wanted: it becomes ``canceled`` whatever attempts are left."""

    def __init__(self, reason: str = "canceled by handler") -> None:
        super().__init__(reason)
        self.reason = reason


class Interrupted(BaseException):
    """brooq stopped the handler. A BaseException, so ``except Exception`` does not swallow it."""

    reason = "interrupted"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.reason)


class AttemptTimedOut(Interrupted):
    """The attempt ran past the kind's ``attempt_timeout``; recorded as a failure."""

    reason = "attempt timed out"


class LeaseLost(Interrupted):
    """Another holder or the reaper took the job; the handler's result will not be written."""

    reason = "lease lost"


class JobCanceledWhileRunning(Interrupted):
    """The job was canceled while it ran; the row stays ``canceled``."""

    reason = "job canceled while running"


def find_signal(error: BaseException) -> BaseException:
    """Return the first HandlerSignal or Interrupted in ``error``'s cause chain, else ``error``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, HandlerSignal | Interrupted):
            return current
        seen.add(id(current))
        # Follow ``raise X from Y`` always, the implicit context unless ``from None`` hid it.
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__
    return error
