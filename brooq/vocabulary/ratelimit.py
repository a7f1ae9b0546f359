"""A topic's rate limit: at most ``count`` starts per second, minute or hour, ``burst`` at once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

MAX_RATE_COUNT = 1_000_000
"""The most starts a rate limit allows per interval (and the largest burst)."""

PERIODS = {"s": timedelta(seconds=1), "m": timedelta(minutes=1), "h": timedelta(hours=1)}
"""The intervals a rate limit may name: ``/s``, ``/m``, ``/h``."""

# [0-9], not \d: \d takes the digits of every script ("٥/s"), which int() reads as 5.
_RATE = re.compile(r"([0-9]+)/([smh])")
_FORMAT = (
    'a whole number of starts per second, minute or hour, like "100/s", "30/m" or "5/h" '
    "(ASCII digits, no spaces)"
)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count`` starts of a topic's jobs per ``per``, and ``burst`` at once.

    Over any window of ``w`` seconds the starts never exceed
    ``burst + count * w / per`` (a token bucket of ``burst`` tokens that
    refills at ``count`` per ``per``). Built by :func:`parse_rate_limit`.
    """

    count: int
    per: timedelta
    burst: int

    @property
    def per_second(self) -> float:
        """Tokens added per second."""
        return self.count / self.per.total_seconds()

    @property
    def interval_us(self) -> int:
        """``per`` in microseconds (the claim's arithmetic is in whole microseconds)."""
        return self.per // timedelta(microseconds=1)

    def __str__(self) -> str:
        unit = next(u for u, p in PERIODS.items() if p == self.per)
        return f"{self.count}/{unit}"


def parse_rate_limit(value: object, burst: object = None) -> tuple[RateLimit | None, list[str]]:
    """``"100/s"`` (or a RateLimit) and an optional burst as a RateLimit; the problems found.

    The burst defaults to one interval's worth (``count``). A RateLimit given
    whole keeps its burst unless ``burst`` is given.
    """
    problems: list[str] = []
    burst_problem = _burst_problem(burst)
    if burst_problem:
        problems.append(burst_problem)
    if isinstance(value, RateLimit):
        count, per = value.count, value.per
        default_burst = value.burst
    elif isinstance(value, str) and (m := _RATE.fullmatch(value)):
        count, per = int(m.group(1)), PERIODS[m.group(2)]
        default_burst = count
    else:
        problems.append(f"rate_limit: must be {_FORMAT}, got {value!r}")
        return None, problems
    if not 1 <= count <= MAX_RATE_COUNT:
        problems.append(
            f"rate_limit: the count must be from 1 to {MAX_RATE_COUNT:,}, got {count:,}"
        )
    if per not in PERIODS.values():
        problems.append(f"rate_limit: the interval must be one second, minute or hour, got {per}")
    if problems:
        return None, problems
    chosen = default_burst if burst is None else burst
    assert isinstance(chosen, int)
    return RateLimit(count, per, chosen), []


def _burst_problem(burst: object) -> str | None:
    if burst is None:
        return None
    if isinstance(burst, bool) or not isinstance(burst, int):
        return f"rate_burst: must be an integer, got {burst!r}"
    if not 1 <= burst <= MAX_RATE_COUNT:
        return f"rate_burst: must be from 1 to {MAX_RATE_COUNT:,}, got {burst:,}"
    return None
