"""Retry delay: exponential with a cap and jitter, safe for any attempt number."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta

_ZERO = timedelta(0)
_US = timedelta(microseconds=1)


def backoff_ceiling(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """``min(base * 2**(attempt-1), cap)``, computed without ever building a huge power."""
    if base <= _ZERO:
        return _ZERO
    if attempt < 1:
        return min(base, cap)
    exponent = attempt - 1
    base_us, cap_us = base // _US, cap // _US
    # base_us >= 1, so once 2**exponent > cap_us the product is above the cap:
    # checking the exponent first keeps attempt = 10**6 cheap and overflow-free.
    # The product is compared in integer microseconds, never as a timedelta,
    # so a cap near timedelta.max cannot overflow either.
    if exponent >= max(cap_us.bit_length(), 1):
        return cap
    return timedelta(microseconds=min(base_us << exponent, cap_us))


def backoff(
    attempt: int,
    base: timedelta,
    cap: timedelta,
    rand: Callable[[], float] = random.random,
) -> timedelta:
    """Delay before retrying after failed ``attempt``: uniform in ``[d/2, d]``, d the ceiling.

    ``rand`` returns a float in [0, 1); pass a fixed one in tests. Computed in
    whole microseconds so that rounding never leaves ``[d/2, d]``.
    """
    ceiling_us = backoff_ceiling(attempt, base, cap) // _US
    if ceiling_us <= 0:
        return _ZERO
    low = (ceiling_us + 1) // 2  # ceil(d/2)
    return timedelta(microseconds=low + round((ceiling_us - low) * rand()))
