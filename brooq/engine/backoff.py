"""Retry delay: exponential with a cap and jitter, safe for any attempt number."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta


def backoff_ceiling(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """``min(base * 2**(attempt-1), cap)``, computed without ever building a huge power."""
    if attempt < 1 or base <= timedelta(0):
        return min(base, cap) if base > timedelta(0) else timedelta(0)
    ratio = cap / base
    # 2**(attempt-1) exceeds the ratio once attempt-1 >= bit length of the ratio:
    # checking the exponent first keeps attempt = 10**6 cheap and overflow-free.
    if attempt - 1 >= max(int(ratio).bit_length(), 1) + 1:
        return cap
    return min(base * (2 ** (attempt - 1)), cap)


def backoff(
    attempt: int,
    base: timedelta,
    cap: timedelta,
    rand: Callable[[], float] = random.random,
) -> timedelta:
    """Delay before retrying after failed ``attempt``: uniform in ``[d/2, d]``, d the ceiling.

    ``rand`` returns a float in [0, 1); pass a fixed one in tests.
    """
    ceiling = backoff_ceiling(attempt, base, cap)
    return ceiling / 2 + (ceiling / 2) * rand()
