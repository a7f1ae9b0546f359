"""Soft interrupts inside a running handler: timeout, lease lost, canceled.

A signal handler raises the matching :class:`brooq.Interrupted` in the main
thread while an attempt is armed, and only then: outside an attempt the
signal is remembered, never raised into brooq's own code. Coroutine
handlers get their task cancelled instead, and the reason is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import FrameType
from typing import Any

from brooq.vocabulary import AttemptTimedOut, Interrupted, JobCanceledWhileRunning, LeaseLost

SIGNAL_REASONS: dict[int, type[Interrupted]] = {
    signal.SIGALRM: AttemptTimedOut,
    signal.SIGUSR1: LeaseLost,
    signal.SIGUSR2: JobCanceledWhileRunning,
}
"""The signal each interrupt arrives by; the supervisor sends USR1/USR2 to a child."""


class InterruptScope:
    """Turns SIGALRM/SIGUSR1/SIGUSR2 into Interrupted exceptions during an attempt."""

    def __init__(self) -> None:
        self.accept: Callable[[int], bool] = _always
        """Whether a signal is meant for the attempt running now (the supervisor's worker
        checks the job a cancel or lost lease names; SIGALRM is always its own)."""
        self._armed = False
        self._installed = False
        self._task: asyncio.Task[object] | None = None
        self._previous: dict[int, Any] = {}
        self.fired: type[Interrupted] | None = None

    @property
    def available(self) -> bool:
        """Signals can only be handled in the main thread."""
        return threading.current_thread() is threading.main_thread()

    def install(self) -> None:
        """Install the signal handlers (main thread only; idempotent)."""
        if self._installed or not self.available:
            return
        for signum in SIGNAL_REASONS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        self._installed = True

    def uninstall(self) -> None:
        """Restore the dispositions found at install (the application's own handlers)."""
        if not self._installed:
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum in SIGNAL_REASONS:
            previous = self._previous.pop(signum, None)
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._installed = False

    def reinstall_if_replaced(self) -> None:
        """Put the handlers back where a handler of a job replaced them (``SIG_IGN`` on
        SIGALRM would disable the timeout of every later job of this process)."""
        if self._installed and any(
            signal.getsignal(signum) != self._on_signal for signum in SIGNAL_REASONS
        ):
            for signum in SIGNAL_REASONS:
                signal.signal(signum, self._on_signal)

    @contextlib.contextmanager
    def attempt(self, timeout: timedelta | None) -> Iterator[None]:
        """Arm interrupts (and the timeout alarm) for the body of the block."""
        self.install()
        self.reinstall_if_replaced()
        self.fired = None
        started = time.monotonic()
        previous = signal.getitimer(signal.ITIMER_REAL)[0] if self._installed else 0.0
        if self._installed and timeout is not None and timeout > timedelta(0):
            signal.setitimer(signal.ITIMER_REAL, timeout.total_seconds())
        self._armed = True
        try:
            yield
        finally:
            self._armed = False
            self._task = None
            if self._installed:
                # Give back a timer someone else had running (a test timeout, say).
                left = previous - (time.monotonic() - started) if previous else 0.0
                signal.setitimer(signal.ITIMER_REAL, max(left, 0.001) if previous else 0)

    def watch_task(self, task: asyncio.Task[object]) -> None:
        """Cancel ``task`` rather than raising, when an interrupt arrives while it runs."""
        self._task = task

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        reason = SIGNAL_REASONS[signum]
        if not self._armed or self.fired is not None or not self.accept(signum):
            return
        self.fired = reason
        if self._task is not None and not self._task.done():
            self._task.cancel(reason.reason)
            # A signal handler's call_soon does not wake a loop blocked in
            # select(); without this, `await asyncio.sleep(10)` ran 10 s.
            self._task.get_loop().call_soon_threadsafe(_nothing)
            return
        self._armed = False
        raise reason()


def _always(signum: int) -> bool:
    """Every signal is meant for the running attempt (one slot, one job)."""
    return True


def _nothing() -> None:
    """A no-op callback: scheduling it thread-safely wakes the event loop."""
