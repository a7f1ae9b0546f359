"""The worker's own guard of its lease: a job never runs past the lease its parent last renewed.

The parent renews the lease of every job it holds (the heartbeat) and posts on
each worker's board until when the leases of the jobs it sent that worker
surely hold. When the parent cannot act — stopped (SIGSTOP, a debugger), swapped
out, its heartbeats cut — the lease ends in the database and another
supervisor's reaper hands the job out while this worker still runs it. So the
worker watches that end itself, by its own clock, in a thread of its own:

- a sixth of a lease before it, the handler is interrupted (``LeaseLost``, as
  when the parent finds the lease lost; nothing is written);
- if the handler still runs ``min(0.5 s, lease/12)`` before it, the worker
  leaves at once (``os._exit``): nothing of the job runs past the lease;
- a job whose lease is that close to its end is not started.

The end the parent posts is safe to use here: it is the moment the parent
*submitted* the statement that set the lease, plus the lease, by
``time.monotonic()`` — the database wrote ``now() + lease`` later — and the
parent and its workers read the same monotonic clock (one per host).

What no process of the host can do for itself: a handler that holds the GIL in
C code, or a worker stopped itself (the whole host paused, a cgroup frozen),
runs no thread to act; the parent's SIGKILL (when the parent runs) or the
kernel are all that can stop it, and a host whose monotonic clock stood still
while it was paused (a VM pause) learns nothing from it. See docs/architecture.md,
"The heartbeat".
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

EXIT_BEFORE_MAX_S = 0.5
"""The worker leaves at most this long before the lease ends (sooner for a short lease)."""


@dataclass(frozen=True, slots=True)
class Margins:
    """How long before the posted lease end the worker interrupts its handler, and leaves."""

    interrupt_s: float
    exit_s: float

    @classmethod
    def of(cls, lease_s: float) -> Margins:
        """The margins for a lease of ``lease_s`` seconds: lease/6 and min(0.5 s, lease/12)."""
        return cls(lease_s / 6, min(EXIT_BEFORE_MAX_S, lease_s / 12))


class LeaseWatch:
    """A daemon thread of the worker that interrupts, then ends, a job whose lease runs out.

    ``lease_until`` reads the lease end the parent posted (the board's; 0: none);
    ``running`` gives the sequence number of the job running now (0: none);
    ``leave`` ends the process (it never returns). The thread sleeps while no
    job runs, and otherwise wakes about every lease/6: never once per job.
    """

    def __init__(
        self,
        lease_until: Callable[[], float],
        lease_s: float,
        running: Callable[[], int],
        leave: Callable[[int, float], NoReturn],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease_until, self.running, self.leave = lease_until, running, leave
        self.clock = clock
        self.margins = Margins.of(lease_s)
        self.fired_for = 0
        """The job the thread interrupted last (its sequence number)."""
        self.parked = False
        self._cond = threading.Condition()
        self._main = threading.main_thread().ident or 0
        self.thread = threading.Thread(target=self._watch, name="brooq-lease-watch", daemon=True)

    def start(self) -> None:
        """Start the thread with every signal blocked in it: signals are the main thread's
        (a blocking call there must be interrupted by them)."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            self.thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def job_started(self) -> None:
        """The main thread started a job: wake the thread if it sleeps for want of one."""
        if self.parked:
            with self._cond:
                self._cond.notify()

    def too_late(self, now: float) -> float | None:
        """The seconds left of the posted lease when it is too close to its end for a job to
        start (within the interrupt margin); None when a job may start."""
        until = self.lease_until()
        if until > 0 and now >= until - self.margins.interrupt_s:
            return until - now
        return None

    def step(self, now: float) -> float | None:
        """Look once: interrupt or leave when due; how long to sleep (None: until a job
        starts)."""
        seq, until = self.running(), self.lease_until()
        if not seq or until <= 0:
            return None
        m = self.margins
        if now >= until - m.exit_s:
            self.leave(seq, until - now)
        if now >= until - m.interrupt_s:
            if self.fired_for != seq:
                self.fired_for = seq
                signal.pthread_kill(self._main, signal.SIGUSR1)
            return min(until - m.exit_s - now, m.interrupt_s)
        return min(until - m.interrupt_s - now, m.interrupt_s)

    def _watch(self) -> None:
        while True:
            wait = self.step(self.clock())
            with self._cond:
                if wait is None:
                    self.parked = True
                    if not self.running():  # after `parked`: job_started sees one or the other
                        self._cond.wait()
                    self.parked = False
                else:
                    self._cond.wait(max(wait, 0.001))
