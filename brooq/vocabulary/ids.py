"""Job ids: UUIDv7, so that ids sort in enqueue order within a process (invariant 10)."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_job_id() -> str:
    """A fresh UUIDv7 string; strictly increasing across calls in this process.

    48 bits of Unix milliseconds, then a 12-bit counter that orders ids made
    in the same millisecond (RFC 9562, method 1), then 62 random bits.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, int.from_bytes(os.urandom(2), "big") & 0x1FF
        else:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
    return str(uuid.UUID(int=value))


def parse_job_id(text: str) -> str:
    """Normalise a job id to canonical lowercase UUID form; ValueError if it is not one."""
    try:
        return str(uuid.UUID(text.strip()))
    except (ValueError, AttributeError):
        raise ValueError(f"{text!r} is not a job id (expected a UUID)") from None
