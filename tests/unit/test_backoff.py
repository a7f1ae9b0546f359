"""Retry backoff: d = min(base * 2^(attempt-1), max), the delay uniform in [d/2, d]."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from brooq.engine.backoff import backoff, backoff_ceiling

US = timedelta(microseconds=1)
SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)

# Any positive duration a timedelta can hold, in whole microseconds.
durations = st.integers(min_value=1, max_value=timedelta.max // US).map(lambda n: n * US)
realistic = st.integers(min_value=1, max_value=10**12).map(lambda n: n * US)  # up to ~11.6 days
attempts = st.integers(min_value=1, max_value=10**9)
rands = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


def expected_ceiling(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """The formula computed naively, in integer microseconds (no timedelta overflow)."""
    micros: int = min(base // US * 2 ** (attempt - 1), cap // US)
    return micros * US


@given(
    attempt=st.integers(min_value=1, max_value=300),
    base=durations,
    cap=durations,
)
def test_ceiling_matches_the_formula(attempt: int, base: timedelta, cap: timedelta) -> None:
    assert backoff_ceiling(attempt, base, cap) == expected_ceiling(attempt, base, cap)


@given(attempt=attempts, base=durations, cap=durations, rand=rands)
@example(attempt=1, base=3 * US, cap=3 * US, rand=0.999999)  # odd microseconds round up
@example(attempt=1, base=5 * US, cap=5 * US, rand=0.0)  # ...and down
@example(attempt=70, base=US, cap=timedelta.max, rand=0.5)  # no overflow near timedelta.max
@example(attempt=3, base=timedelta.max / 3, cap=timedelta.max, rand=0.5)
def test_delay_within_half_ceiling_and_ceiling(
    attempt: int, base: timedelta, cap: timedelta, rand: float
) -> None:
    d = backoff_ceiling(attempt, base, cap)
    delay = backoff(attempt, base, cap, rand=lambda: rand)
    assert d <= cap
    assert 2 * (delay // US) >= d // US, f"{delay} below half of {d}"
    assert delay <= d, f"{delay} above the ceiling {d}"
    assert delay <= cap


@given(attempt=attempts, base=durations, cap=durations)
def test_never_above_max(attempt: int, base: timedelta, cap: timedelta) -> None:
    assert backoff_ceiling(attempt, base, cap) <= cap
    assert backoff(attempt, base, cap) <= cap
    assert backoff(attempt, base, cap) >= timedelta(0)


@given(base=durations, cap=durations, attempt=st.integers(min_value=1, max_value=10**6))
def test_ceiling_is_monotone_in_attempt(base: timedelta, cap: timedelta, attempt: int) -> None:
    assert backoff_ceiling(attempt, base, cap) <= backoff_ceiling(attempt + 1, base, cap)


@given(base=realistic, cap=realistic)
def test_ceiling_reaches_max_and_stays(base: timedelta, cap: timedelta) -> None:
    ceilings = [backoff_ceiling(a, base, cap) for a in range(1, 64)]
    assert ceilings == sorted(ceilings)
    assert ceilings[0] == min(base, cap)
    assert ceilings[-1] == cap  # 2**40 microseconds already exceed any realistic cap


@pytest.mark.parametrize("attempt", [10**6, 10**9, 10**18, 2**63])
def test_huge_attempt_is_cheap_and_gives_max(attempt: int) -> None:
    started = time.perf_counter()
    for base, cap in [(SECOND, MINUTE), (US, timedelta.max), (timedelta(days=1), timedelta.max)]:
        assert backoff_ceiling(attempt, base, cap) == cap
        delay = backoff(attempt, base, cap)
        assert cap / 2 <= delay <= cap
        assert 2 * (backoff(attempt, base, cap, rand=lambda: 0.0) // US) >= cap // US
    assert time.perf_counter() - started < 0.1


def test_examples_base_one_second_max_one_minute() -> None:
    ceilings = [backoff_ceiling(a, SECOND, MINUTE) for a in range(1, 10)]
    assert ceilings == [timedelta(seconds=s) for s in (1, 2, 4, 8, 16, 32, 60, 60, 60)]


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [(1, 0.5, 1), (2, 1, 2), (3, 2, 4), (4, 4, 8), (6, 16, 32), (7, 30, 60), (100, 30, 60)],
)
def test_jitter_bounds_for_base_one_second(attempt: int, low: float, high: float) -> None:
    assert backoff(attempt, SECOND, MINUTE, rand=lambda: 0.0) == timedelta(seconds=low)
    assert backoff(attempt, SECOND, MINUTE, rand=lambda: 0.999999999) == timedelta(seconds=high)
    assert (
        timedelta(seconds=low)
        < backoff(attempt, SECOND, MINUTE, rand=lambda: 0.5)
        < timedelta(seconds=high)
    )


def test_default_rand_spreads_over_the_range() -> None:
    delays = {backoff(7, SECOND, MINUTE) for _ in range(200)}
    assert all(timedelta(seconds=30) <= d <= MINUTE for d in delays)
    assert len(delays) > 100  # jitter, not a constant


def test_base_not_above_max_gives_max_from_the_start() -> None:
    assert backoff_ceiling(1, MINUTE, SECOND) == SECOND
    assert backoff_ceiling(1, MINUTE, MINUTE) == MINUTE


def test_degenerate_inputs_do_not_raise() -> None:
    assert backoff_ceiling(0, SECOND, MINUTE) == SECOND
    assert backoff_ceiling(-5, SECOND, MINUTE) == SECOND
    assert backoff_ceiling(3, timedelta(0), MINUTE) == timedelta(0)
    assert backoff(3, timedelta(0), MINUTE) == timedelta(0)
    assert backoff(3, SECOND, timedelta(0)) == timedelta(0)
