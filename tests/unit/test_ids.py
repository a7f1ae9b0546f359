"""Job ids follow the clock: a forward jump of the clock does not pin them in the future.

Issue 32, item 14: the UUIDv7 maker kept counting from the latest stamp it had
given, so one forward jump of the wall clock (an NTP step, a VM restored from a
snapshot) put every later id of the process, and so the partition each row
goes to, as far in the future as the jump, until the clock got there.
"""

from __future__ import annotations

import itertools
import os
import uuid

import pytest

from brooq.vocabulary.ids import FOLLOW_BACK_AFTER_MS, JobIds

START_MS = 1_767_225_600_000  # 2026-01-01 00:00 UTC
HOUR_MS = 3_600_000


class WallClock:
    """A wall clock the test sets, in milliseconds (read as nanoseconds, like time.time_ns)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms * 1_000_000


def stamp(job_id: str) -> int:
    """The Unix milliseconds of a UUIDv7."""
    return uuid.UUID(job_id).int >> 80


def increasing(ids: list[str]) -> bool:
    return all(a < b for a, b in itertools.pairwise(ids))


def test_after_a_jump_forward_and_back_the_ids_follow_the_clock_again() -> None:
    clock = WallClock(START_MS)
    ids = JobIds(clock)
    before = ids.make(3)
    clock.ms += HOUR_MS  # the clock jumps an hour ahead...
    ahead = ids.make(3)
    assert {stamp(i) for i in ahead} == {START_MS + HOUR_MS}
    clock.ms = START_MS + 5  # ...and is set right 5 ms after the first ids
    back = ids.make(3)
    assert {stamp(i) for i in back} == {START_MS + 5}  # not START_MS + HOUR_MS
    assert increasing(before) and increasing(ahead) and increasing(back)
    assert len(set(before + ahead + back)) == 9
    clock.ms += 1
    assert stamp(ids.make(1)[0]) == START_MS + 6  # and goes on with it


def test_ids_stay_increasing_while_the_clock_runs_normally_or_steps_back_a_little() -> None:
    clock = WallClock(START_MS)
    ids = JobIds(clock)
    made = ids.make(5)
    clock.ms += 1
    made += ids.make(5)
    made += ids.make(5)  # the same millisecond: the counter orders them
    clock.ms -= 300  # a small step back (a slew, a bulk batch that borrowed ahead)
    made += ids.make(5)
    clock.ms -= FOLLOW_BACK_AFTER_MS - 300  # still not further back than the bound
    made += ids.make(5)
    assert increasing(made) and len(set(made)) == len(made)
    assert stamp(made[-1]) == START_MS + 1  # counted on from the latest stamp


def test_a_batch_larger_than_the_counter_borrows_ahead_and_the_next_call_stays_in_order() -> None:
    clock = WallClock(START_MS)
    ids = JobIds(clock)
    batch = ids.make(20_000)  # about 5 ms worth of the 12-bit counter, in one millisecond
    after = ids.make(10)
    assert increasing(batch + after) and len(set(batch + after)) == 20_010
    assert START_MS < stamp(after[-1]) < START_MS + 10


def test_every_id_is_a_canonical_uuid7() -> None:
    clock = WallClock(START_MS)
    for text in JobIds(clock).make(100):
        value = uuid.UUID(text)
        assert str(value) == text and value.version == 7 and value.variant == uuid.RFC_4122


def reference(ms: int, counter: int, random8: bytes) -> str:
    """A UUIDv7 made the plain way, from one 128-bit int: what every id must equal."""
    random62 = int.from_bytes(random8, "big") & (1 << 62) - 1
    return str(uuid.UUID(int=ms << 80 | 7 << 76 | counter << 64 | 0b10 << 62 | random62))


def test_a_batch_is_its_bytes_and_counters_formatted_as_one_int_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 32: ids are made for a whole batch at once (one random read, the variant set
    # with one mask, the counter's digits from a table); each must still be exactly the
    # UUIDv7 of its stamp, counter and random bytes, across a rollover of the counter.
    randoms = bytes(range(256)) * 200  # every byte value in every position of an id
    monkeypatch.setattr(os, "urandom", lambda n: randoms[:n])
    clock = WallClock(START_MS)
    batch = JobIds(clock).make(5_000)
    start = int.from_bytes(randoms[8 * 5_000 : 8 * 5_000 + 2], "big") & 0x1FF
    expected = []
    for i in range(5_000):
        ms, counter = divmod(start + i, 4_096)
        expected.append(reference(START_MS + ms, counter, randoms[8 * i : 8 * i + 8]))
    assert batch == expected
    assert {stamp(i) for i in batch} == {START_MS, START_MS + 1}


def test_ids_increase_within_and_across_batches_of_every_size() -> None:
    clock = WallClock(START_MS)
    ids = JobIds(clock)
    made: list[str] = []
    for size in (1, 2, 999, 4_096, 1, 3_000, 1_000, 4_097, 7, 0, 5):
        made += ids.make(size)  # the same millisecond throughout: the counter orders them
    clock.ms += 2
    for size in (1_000, 1):
        made += ids.make(size)
    assert increasing(made) and len(made) == 14_209
    for text in made[::97]:
        value = uuid.UUID(text)
        assert str(value) == text and value.version == 7 and value.variant == uuid.RFC_4122
