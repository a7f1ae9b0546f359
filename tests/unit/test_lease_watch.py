"""The worker's own lease watch (issue 32, item 1): it interrupts the handler a sixth of a lease
before the lease its parent posted ends, and leaves just before it ends; no job starts that late.

``step`` is driven with a settable clock; one test runs the real thread, whose SIGUSR1 reaches
this (main) thread as it would reach a worker's handler.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

import pytest

from brooq.supervisor.leasewatch import LeaseWatch, Margins

LEASE_S = 12.0  # margins: interrupt 2 s before the end, leave 0.5 s before it


class Interrupted(Exception):
    """What the test's SIGUSR1 handler raises in the main thread."""


class Left(BaseException):
    """What the test's ``leave`` raises instead of ending the process."""


class Rig:
    def __init__(self) -> None:
        self.until = 0.0
        self.seq = 0
        self.left: list[tuple[int, float]] = []
        self.signals = 0

    def leave(self, seq: int, left_s: float) -> NoReturn:
        self.left.append((seq, left_s))
        raise Left

    def watch(self) -> LeaseWatch:
        return LeaseWatch(lambda: self.until, LEASE_S, lambda: self.seq, self.leave)


@pytest.fixture
def usr1() -> Iterator[list[int]]:
    """Count the SIGUSR1s this thread gets while the test runs."""
    got: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield got
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_the_margins_are_a_sixth_of_the_lease_and_at_most_half_a_second() -> None:
    assert Margins.of(12.0) == Margins(2.0, 0.5)
    assert Margins.of(120.0) == Margins(20.0, 0.5)
    assert Margins.of(3.0) == Margins(0.5, 0.25)


def test_no_job_or_no_posted_lease_parks_the_watch() -> None:
    rig = Rig()
    watch = rig.watch()
    rig.until = 100.0
    assert watch.step(50.0) is None  # no job runs
    rig.seq, rig.until = 1, 0.0
    assert watch.step(50.0) is None  # the parent posted no lease (no board)


def test_a_job_far_from_its_lease_end_sleeps_at_most_a_sixth_of_the_lease(
    usr1: list[int],
) -> None:
    rig = Rig()
    watch = rig.watch()
    rig.seq, rig.until = 1, 100.0
    assert watch.step(97.0) == pytest.approx(1.0)  # until the interrupt point, 98
    assert watch.step(50.0) == pytest.approx(2.0)  # never longer than lease/6: the end may move
    assert usr1 == [] and watch.fired_for == 0 and watch.too_late(97.0) is None


def test_the_handler_is_interrupted_once_then_the_worker_leaves(usr1: list[int]) -> None:
    rig = Rig()
    watch = rig.watch()
    rig.seq, rig.until = 3, 100.0
    assert watch.step(98.2) == pytest.approx(1.3)  # interrupted; next look at the exit point
    time.sleep(0)  # the handler runs at the next bytecode boundary
    assert usr1 == [signal.SIGUSR1] and watch.fired_for == 3
    assert watch.step(98.5) == pytest.approx(1.0)
    assert usr1 == [signal.SIGUSR1]  # once per job
    assert watch.too_late(98.5) == pytest.approx(1.5)  # no job starts now
    rig.until = 103.0  # a heartbeat got through after all: the lease goes on
    assert watch.step(99.0) == pytest.approx(2.0)
    rig.until = 100.0
    with pytest.raises(Left):
        watch.step(99.6)
    ((seq, left_s),) = rig.left
    assert seq == 3 and left_s == pytest.approx(0.4)


def test_the_next_job_gets_its_own_interrupt(usr1: list[int]) -> None:
    rig = Rig()
    watch = rig.watch()
    rig.seq, rig.until = 1, 100.0
    watch.step(98.5)
    rig.seq = 2
    watch.step(98.6)
    time.sleep(0)
    assert usr1 == [signal.SIGUSR1] * 2 and watch.fired_for == 2


def test_the_thread_wakes_for_a_job_interrupts_it_and_leaves(
    usr1: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = Rig()
    # The test's ``leave`` ends the thread by raising (os._exit would end pytest).
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    ended = threading.Event()

    def leave(seq: int, left_s: float) -> NoReturn:
        rig.left.append((seq, left_s))
        ended.set()
        raise Left

    watch = LeaseWatch(lambda: rig.until, 0.6, lambda: rig.seq, leave)
    watch.start()
    deadline = time.monotonic() + 2
    while not watch.parked and time.monotonic() < deadline:
        time.sleep(0.005)
    assert watch.parked, "the idle watch does not sleep until a job starts"
    rig.until = time.monotonic() + 0.3  # interrupt at -0.1 s, leave at -0.05 s
    rig.seq = 1
    watch.job_started()
    try:
        while not usr1 and time.monotonic() < deadline:
            time.sleep(0.005)  # the signal interrupts this sleep, as it would a handler's
        assert usr1 == [signal.SIGUSR1]
        assert ended.wait(2), "the watch did not leave"
    finally:
        rig.seq = 0
    watch.thread.join(2)
    ((seq, left_s),) = rig.left
    assert seq == 1 and 0 < left_s <= 0.05
    assert time.monotonic() < rig.until  # it left before the lease ended
