"""Job ids: UUIDv7, so that ids sort in enqueue order within a process (invariant 10)."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0
_RAND_MASK = (1 << 62) - 1


def new_job_ids(count: int) -> list[str]:
    """``count`` fresh UUIDv7 strings, strictly increasing across calls in this process.

    48 bits of Unix milliseconds, then a 12-bit counter that orders ids made
    in the same millisecond (RFC 9562, method 1), then 62 random bits.
    """
    global _last_ms, _counter
    randoms = os.urandom(8 * count)
    stamps = []
    with _lock:
        ms = time.time_ns() // 1_000_000
        for _ in range(count):
            if ms > _last_ms:
                _last_ms, _counter = ms, randoms[0] & 0x1FF  # random start, room to count
            else:
                _counter += 1
                if _counter > 0xFFF:
                    _last_ms, _counter = _last_ms + 1, 0
            stamps.append((_last_ms, _counter))
    out = []
    for i, (stamp, counter) in enumerate(stamps):
        rand = int.from_bytes(randoms[8 * i : 8 * i + 8], "big") & _RAND_MASK
        value = (stamp & 0xFFFFFFFFFFFF) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
        h = f"{value:032x}"
        out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return out


def new_job_id() -> str:
    """A fresh UUIDv7 string (see :func:`new_job_ids`)."""
    return new_job_ids(1)[0]


def parse_job_id(text: str) -> str:
    """Normalise a job id to canonical lowercase UUID form; ValueError if it is not one."""
    try:
        return str(uuid.UUID(text.strip()))
    except (ValueError, AttributeError):
        raise ValueError(f"{text!r} is not a job id (expected a UUID)") from None
