"""The bookkeeping of claims from floors (brooq/postgres/floors.py), without a database.

What the claim statement returns is simulated: the rows a claim took, the fresh levels
its look found. The promises: a floor only moves on past rows its claimer took, goes back
to any fresh row, is not moved on by a claim that read from above a fresh row found
meanwhile, and a sweep goes back to the lowest floor since the previous sweep.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from brooq.postgres.floors import FULL_SWEEP_S, START, SWEEP_S, Floors, TopicFloors

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
NIL = START[1]


def at(s: int) -> datetime:
    return T0 + timedelta(seconds=s)


def place(s: int, job_id: str = "00000000-0000-0000-0000-00000000000a") -> tuple[datetime, str]:
    return (at(s), job_id)


def test_a_floor_moves_on_only_past_what_was_claimed_from_it() -> None:
    state = TopicFloors("s", "s", {0: START})
    state.advance(0, place(5), START)
    assert state.floors[0] == place(5)
    state.advance(0, place(3), START)  # a row behind the floor: never back
    assert state.floors[0] == place(5)


def test_a_claim_that_read_from_above_a_fresh_row_does_not_move_the_floor_past_it() -> None:
    state = TopicFloors("s", "s", {0: place(10)})
    assert state.lower(0, (at(2), NIL))  # another claim's look found a row at 2
    state.advance(0, place(12), place(10))  # a claim that began at 10 took a row at 12
    assert state.floors[0] == (at(2), NIL), "the row at 2 must still be read"


def test_lower_only_moves_back_and_the_next_sweep_goes_back_to_it() -> None:
    state = TopicFloors("s", "s", {0: place(10)})
    assert not state.lower(0, place(11))
    assert state.lower(0, place(4))
    state.advance(0, place(20), place(4))
    assert state.floors[0] == place(20)
    state.sweep()
    assert state.floors[0] == place(4), "a fresh row behind the previous sweep's floor"


def test_a_sweep_reads_the_last_interval_again_and_a_full_one_everything() -> None:
    state = TopicFloors("s", "s", {0: place(1), 5: START})
    state.advance(0, place(9), place(1))
    state.advance(5, place(3), START)
    state.sweep()
    assert state.floors == {0: place(1), 5: START}, "back to where the interval began"
    state.advance(0, place(20), place(1))
    state.advance(5, place(30), START)
    state.sweep()
    assert state.floors == {0: place(9), 5: place(3)}, "only the last interval: not again"
    state.advance(0, place(40), place(9))
    state.sweep(full=True)
    assert state.floors == {0: START, 5: START}
    state.advance(0, place(50), START)
    state.sweep()
    assert state.floors[0] == place(40), "after a full sweep, the interval before it"


def test_a_new_level_found_fresh_is_added() -> None:
    state = TopicFloors("s", "s", {0: START})
    assert state.lower(7, (at(1), NIL))
    assert state.floors[7] == (at(1), NIL)


def test_look_lists_levels_highest_first_and_sweeps_every_interval() -> None:
    clock = [100.0]
    floors = Floors(lambda: clock[0])
    assert floors.unknown(["a", "b"]) == ["a", "b"]
    floors.begin("a", "10:12:", [0, 5, -3])
    assert floors.unknown(["a", "b"]) == ["b"]
    used = floors.look(["a"])
    assert used["levels"] == [5, 0, -3]
    assert used["floor_topics"] == ["a", "a", "a"]
    assert used["seen"] == ["10:12:"]
    assert used["everywhere"] is False
    clock[0] += SWEEP_S
    assert floors.look(["a"])["everywhere"] is True
    assert floors.look(["a"])["everywhere"] is False, "once an interval"


def test_a_full_sweep_comes_every_full_interval() -> None:
    clock = [0.0]
    floors = Floors(lambda: clock[0])
    floors.begin("a", "1:1:", [0])
    floors.claimed(floors.look(["a"]), [], [("a", 0, at(5), "j5")])
    for _ in range(int(FULL_SWEEP_S / SWEEP_S) - 1):
        clock[0] += SWEEP_S
        used = floors.look(["a"])
        floors.claimed(used, [], [("a", 0, at(5 + int(clock[0])), f"j{clock[0]}")])
        assert used["ats"] != [START[0]] or clock[0] == SWEEP_S, "the first sweep: from START"
    clock[0] += SWEEP_S
    assert floors.look(["a"])["ats"] == [START[0]], "back to the start of the level"


def test_claimed_records_the_snapshot_lowers_then_advances() -> None:
    floors = Floors()
    floors.begin("a", "10:12:", [0])
    used = floors.look(["a"])
    floors.claimed(used, [("a", None, None, "20:20:")], [("a", 0, at(5), "j5")])
    again = floors.look(["a"])
    assert again["seen"] == ["20:20:"]
    assert (again["ats"], again["ids"]) == ([at(5)], ["j5"])
    # A look that found a fresh row at 2 on level 0 and one on a new level 3; the claim,
    # which read from those fresh floors, took the rows at 2 and 1 (level 3).
    floors.claimed(
        again,
        [("a", 0, at(2), "30:30:"), ("a", 3, at(1), "30:30:")],
        [("a", 3, at(1), "j1"), ("a", 0, at(2), "j2")],
    )
    third = floors.look(["a"])
    assert third["levels"] == [3, 0]
    assert list(zip(third["ats"], third["ids"], strict=True)) == [(at(1), "j1"), (at(2), "j2")]
    assert third["seen"] == ["30:30:"]


def test_a_sweep_look_records_the_snapshot_of_every_partition() -> None:
    clock = [0.0]
    floors = Floors(lambda: clock[0])
    floors.begin("a", "1:1:", [0])
    floors.claimed(floors.look(["a"]), [("a", None, None, "2:2:")], [])
    clock[0] += SWEEP_S
    swept = floors.look(["a"])
    assert swept["seen"] == ["1:1:"], "a sweep looks from the last sweep's snapshot"
    floors.claimed(swept, [("a", None, None, "3:3:")], [])
    assert floors.look(["a"])["seen"] == ["3:3:"]
    clock[0] += SWEEP_S
    assert floors.look(["a"])["seen"] == ["3:3:"]
