"""Which expired leases a reaper run reads (brooq/postgres/upkeep.py, ReapWindow)."""

from __future__ import annotations

from datetime import timedelta

from brooq.postgres.upkeep import REAP_FULL_S, REAP_SLACK, ReapWindow


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_run_reads_every_expired_lease_then_only_since_the_previous_run() -> None:
    clock = Clock()
    reap = ReapWindow(clock)
    started, window = reap.window()
    assert window is None
    reap.ran(started, window, cut=False)
    clock.now += 7
    started, window = reap.window()
    assert window == timedelta(seconds=7) + REAP_SLACK
    reap.ran(started, window, cut=False)
    clock.now += 3
    assert reap.window()[1] == timedelta(seconds=3) + REAP_SLACK


def test_every_full_interval_a_run_reads_everything_again() -> None:
    clock = Clock()
    reap = ReapWindow(clock)
    for _ in range(int(REAP_FULL_S // 10)):
        started, window = reap.window()
        reap.ran(started, window, cut=False)
        clock.now += 10
    assert reap.window()[1] is None, "a lease another session held at a windowed run"


def test_a_run_cut_by_its_batch_is_followed_by_a_full_one() -> None:
    clock = Clock()
    reap = ReapWindow(clock)
    started, window = reap.window()
    reap.ran(started, window, cut=False)
    clock.now += 5
    started, window = reap.window()
    assert window is not None
    reap.ran(started, window, cut=True)
    clock.now += 5
    assert reap.window()[1] is None
