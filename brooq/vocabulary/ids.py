"""Job ids: UUIDv7, so that ids sort in enqueue order within a process (invariant 10)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable

_COUNTER_MAX = 0xFFF
_COUNTER_HEX = "".join(f"{c:03x}" for c in range(_COUNTER_MAX + 1))
"""Every counter's three hex digits, one after the other (12 KiB)."""
_RANDOM_MASK = b"\x3f" + b"\xff" * 7
_VARIANT = b"\x80" + b"\x00" * 7
"""An id's 64 random bits: the top two cleared by _RANDOM_MASK, then set to the variant,
binary 10, by _VARIANT."""

FOLLOW_BACK_AFTER_MS = 1_000
"""How far the wall clock may fall behind the latest id's stamp before ids follow it back."""


class JobIds:
    """The UUIDv7 ids of one process, made from a wall clock (``now_ns``: Unix nanoseconds).

    While the clock runs normally the ids strictly increase across calls.
    When the clock falls behind the latest stamp by at most
    `FOLLOW_BACK_AFTER_MS`, ids go on counting from that stamp (still
    increasing); when it falls further behind, they follow the clock again.
    """

    def __init__(self, now_ns: Callable[[], int] = time.time_ns) -> None:
        self._now_ns = now_ns
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def make(self, count: int) -> list[str]:
        """``count`` fresh UUIDv7 strings, strictly increasing (see the class for the clock).

        48 bits of Unix milliseconds, then a 12-bit counter that orders ids made
        in the same millisecond (RFC 9562, method 1), then 62 random bits.
        """
        randoms = os.urandom(8 * count + 2)  # 62 bits an id, and the counter's start
        with self._lock:
            runs = self._runs(count, int.from_bytes(randoms[-2:], "big") & 0x1FF)
        return _format(runs, _random_hex(randoms, count))

    def _runs(self, count: int, start: int) -> list[tuple[int, int, int]]:
        """The stamps of ``count`` ids as runs (ms, first counter, ids), advancing the state;
        ``start``: a random counter for a new millisecond. Under the lock."""
        ms = self._now_ns() // 1_000_000
        # A stamp ahead of the clock by a little is ours: a batch of more than 4,096
        # ids a millisecond borrows from the next ones, and a clock slewed or stepped
        # back by some milliseconds comes back there soon; counting on from it keeps
        # the ids increasing. A stamp further ahead than any batch borrows (1 s is
        # ~3.5 million ids) comes from a clock that jumped forward and was set right:
        # counting on from it would keep every id of this process, and the partition
        # its row goes to (ids are creation times), as far in the future as the jump
        # for as long as it lasted. Following the clock back is safe: uniqueness
        # never rested on the order (each id has 62 random bits, and the primary key
        # would refuse a repeat rather than merge it); the ids of one call (one
        # batch) still increase; only a call after the step sorts before those made
        # during the jump, and the claim orders by available_at first (the
        # database's clock, set by each transaction), so the order of jobs only
        # changes for two enqueues in one transaction that straddle the step.
        if ms > self._last_ms or self._last_ms - ms > FOLLOW_BACK_AFTER_MS:
            self._last_ms, self._counter = ms, start  # room to count
        else:
            self._counter += 1
        runs = []
        while count:
            if self._counter > _COUNTER_MAX:
                self._last_ms, self._counter = self._last_ms + 1, 0
            take = min(count, _COUNTER_MAX + 1 - self._counter)
            runs.append((self._last_ms, self._counter, take))
            self._counter += take
            count -= take
        self._counter -= 1  # the latest id's
        return runs


def _random_hex(randoms: bytes, count: int) -> str:
    """The random part of ``count`` ids as 16 hex digits each, the variant (binary 10) set
    in the top bits: one integer for the batch, masked at once rather than id by id."""
    value = int.from_bytes(randoms[: 8 * count], "big")
    mask = int.from_bytes(_RANDOM_MASK * count, "big")
    value = value & mask | int.from_bytes(_VARIANT * count, "big")
    return f"{value:0{16 * count}x}"


def _format(runs: list[tuple[int, int, int]], hexes: str) -> list[str]:
    """The ids of ``runs`` (ms, first counter, ids), the random bits from ``hexes``.

    Made as text, not as a 128-bit int formatted (a bulk enqueue makes thousands a
    second): the stamp's digits once per run, the version digit 7, the counter's three
    digits sliced from a table, then the random part.
    """
    out: list[str] = []
    table, at = _COUNTER_HEX, 0
    for stamp, first, n in runs:
        h = f"{stamp & 0xFFFFFFFFFFFF:012x}"
        prefix = f"{h[:8]}-{h[8:]}-7"
        counters = range(3 * first, 3 * (first + n), 3)
        out += [
            f"{prefix}{table[c : c + 3]}-{hexes[r : r + 4]}-{hexes[r + 4 : r + 16]}"
            for c, r in zip(counters, range(at, at + 16 * n, 16), strict=True)
        ]
        at += 16 * n
    return out


_PROCESS_IDS = JobIds()


def new_job_ids(count: int) -> list[str]:
    """``count`` fresh UUIDv7 strings, strictly increasing across calls in this process
    while its clock runs normally (see :class:`JobIds`)."""
    return _PROCESS_IDS.make(count)


def new_job_id() -> str:
    """A fresh UUIDv7 string (see :func:`new_job_ids`)."""
    return _PROCESS_IDS.make(1)[0]


def parse_job_id(text: str) -> str:
    """Normalise a job id to canonical lowercase UUID form; ValueError if it is not one."""
    try:
        return str(uuid.UUID(text.strip()))
    except (ValueError, AttributeError):
        raise ValueError(f"{text!r} is not a job id (expected a UUID)") from None
