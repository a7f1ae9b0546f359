"""A worker's board: a few words of memory the parent and one worker share, and a lock.

The parent sends a worker its next jobs ahead of time (its queue), each
with a sequence number. What each side must know of the other without a
message round trip is written here:

- the worker writes which job it started (``started``) and when, under the
  lock, after checking that job was not taken back;
- the parent takes back the jobs a worker has not started (a long job runs
  ahead of them) by writing a *fence* under the same lock: every sequence
  number after the one started, up to the last one sent, is no longer the
  worker's to run;
- the parent names the job an interrupt (cancel, lost lease) is meant for
  before it signals the worker, so a signal that arrives after that job
  ended never hits the next one;
- the parent posts until when the leases of the jobs it sent the worker
  surely hold (``lease_until``, monotonic: the earliest lease end of them,
  renewed by every heartbeat); the worker stops its handler before then on
  its own, even when the parent cannot (frozen, stopped, swapped out).

Under the lock a job is either started or taken back, never both: a job is
never run twice by a take-back. The lock is a POSIX semaphore in shared
memory; the parent never waits on it for more than a few milliseconds (a
worker holds it for a microsecond, unless it was killed holding it: then
the take-back waits for the worker's exit instead).
"""

from __future__ import annotations

import mmap
import multiprocessing
import struct
import time
from dataclasses import dataclass
from typing import Any

_LAYOUT = struct.Struct("=qdqqqqd")
"""started seq, started at (monotonic), fence low, fence high, interrupt seq, interrupt code,
lease until (monotonic; 0: none posted)."""
_SEQ = struct.Struct("=q")
_AT = struct.Struct("=d")
_AT_OFFSET = _SEQ.size
_STARTED = struct.Struct("=qd")
_FENCE = struct.Struct("=qq")
_FENCE_AT = _STARTED.size
_INTERRUPT = struct.Struct("=qq")
_INTERRUPT_AT = _FENCE_AT + _FENCE.size
_LEASE_AT = _INTERRUPT_AT + _INTERRUPT.size
TAKE_BACK_WAIT_S = 0.005
"""The longest the parent waits for a worker's lock before it tries again next tick."""


@dataclass(frozen=True, slots=True)
class Started:
    """The job a worker started last: its sequence number and monotonic start time."""

    seq: int
    at: float


class Board:
    """Shared between the parent and one worker; made in the parent before the fork."""

    def __init__(self) -> None:
        self._mem = mmap.mmap(-1, _LAYOUT.size)  # anonymous and shared: the fork inherits it
        _LAYOUT.pack_into(self._mem, 0, 0, 0.0, 0, 0, 0, 0, 0.0)
        self._lock: Any = multiprocessing.get_context("fork").Lock()

    # --- the worker's side ------------------------------------------------------------------

    def start(self, seq: int) -> bool:
        """Claim job ``seq`` as started now; False when the parent took it back."""
        with self._lock:
            low, high = _FENCE.unpack_from(self._mem, _FENCE_AT)
            if low < seq <= high:
                return False
            # The time first, then the number: the parent reads without the lock, and a
            # number it sees new always comes with its own time (stores keep their order).
            _AT.pack_into(self._mem, _AT_OFFSET, time.monotonic())
            _SEQ.pack_into(self._mem, 0, seq)
        return True

    def interrupt_for(self, seq: int) -> int:
        """The interrupt code the parent posted for job ``seq`` (0: none)."""
        target, code = _INTERRUPT.unpack_from(self._mem, _INTERRUPT_AT)
        return int(code) if target == seq else 0

    def lease_until(self) -> float:
        """Until when (monotonic) the lease of every job the parent sent surely holds; 0.0
        when the parent posted none. One aligned 8-byte word: read whole, without the lock."""
        (until,) = _AT.unpack_from(self._mem, _LEASE_AT)
        return float(until)

    # --- the parent's side ------------------------------------------------------------------

    def started(self) -> Started:
        """The job the worker started last (seq 0: none yet)."""
        (seq,) = _SEQ.unpack_from(self._mem, 0)
        (at,) = _AT.unpack_from(self._mem, _AT_OFFSET)  # read after the number, see start()
        return Started(int(seq), float(at))

    def take_back(self, last_sent: int) -> int | None:
        """Fence every job after the one started, up to ``last_sent``: the worker will not
        start them. The seq started when the fence went up, or None when the lock was not
        free (try again later)."""
        if not self._lock.acquire(timeout=TAKE_BACK_WAIT_S):
            return None
        try:
            started = int(_STARTED.unpack_from(self._mem, 0)[0])
            _FENCE.pack_into(self._mem, _FENCE_AT, started, max(last_sent, started))
        finally:
            self._lock.release()
        return started

    def post_interrupt(self, seq: int, code: int) -> None:
        """Name job ``seq`` as the target of the interrupt about to be signalled."""
        _INTERRUPT.pack_into(self._mem, _INTERRUPT_AT, seq, code)

    def post_lease(self, until: float) -> None:
        """Post until when (monotonic) the leases of the jobs sent to the worker surely hold."""
        _AT.pack_into(self._mem, _LEASE_AT, until)

    def close(self) -> None:
        """Unmap the memory (the parent, once the worker is reaped)."""
        self._mem.close()
