"""Periodic schedules: cron evaluation, time zones, registration, and the scheduler over the fake.

Time is injected everywhere: the scheduler gets ``now`` from the test, the
in-memory store a settable clock. Nothing sleeps.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brooq.engine.fake import InMemoryStore
from brooq.engine.periodic import (
    MAX_CATCH_UP,
    PeriodicScheduler,
    check_schedule,
    latest_run,
    next_run,
    runs_between,
)
from brooq.queue import Queue
from brooq.vocabulary import InvalidJob, Job, Schedule, State, StoreUnavailable


def utc(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    microsecond: int = 0,
) -> datetime:
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)


def every5(**kw: Any) -> Schedule:
    return Schedule("*/5 * * * *", topic="tick", **kw)


# -- cron evaluation --------------------------------------------------------------------------


def test_latest_run_is_at_or_before_now() -> None:
    s = every5()
    assert latest_run(s, utc(2026, 1, 1, 12, 5)) == utc(2026, 1, 1, 12, 5)  # on the boundary
    assert latest_run(s, utc(2026, 1, 1, 12, 5) - timedelta(microseconds=1)) == utc(
        2026, 1, 1, 12, 0
    )
    assert latest_run(s, utc(2026, 1, 1, 12, 9, 59, 999999)) == utc(2026, 1, 1, 12, 5)
    assert latest_run(s, utc(2026, 1, 1, 0, 0, 30)) == utc(2026, 1, 1)
    yearly = Schedule("0 0 1 1 *", topic="tick")
    assert latest_run(yearly, utc(2026, 7, 1)) == utc(2026, 1, 1)


def test_latest_run_accepts_any_time_zone_for_now() -> None:
    s = every5()
    from zoneinfo import ZoneInfo

    now = datetime(2026, 1, 1, 13, 7, tzinfo=ZoneInfo("Europe/Berlin"))  # 12:07 UTC
    assert latest_run(s, now) == utc(2026, 1, 1, 12, 5)
    assert latest_run(s, now).tzinfo is UTC  # type: ignore[union-attr]


def test_runs_between_is_open_closed() -> None:
    s = every5()
    assert runs_between(s, utc(2026, 1, 1, 12), utc(2026, 1, 1, 12, 15)) == [
        utc(2026, 1, 1, 12, 5),
        utc(2026, 1, 1, 12, 10),
        utc(2026, 1, 1, 12, 15),
    ]
    assert runs_between(s, utc(2026, 1, 1, 12, 1), utc(2026, 1, 1, 12, 4, 59)) == []
    assert runs_between(s, utc(2026, 1, 1, 12, 0, 1), utc(2026, 1, 1, 12, 5)) == [
        utc(2026, 1, 1, 12, 5)
    ]


def test_runs_between_keeps_only_the_latest_hundred_and_stays_cheap() -> None:
    s = Schedule("* * * * *", topic="tick")
    until = utc(2026, 1, 1, 12)
    runs = runs_between(s, until - timedelta(days=365 * 3), until)  # 1.5 million runs ago
    assert len(runs) == MAX_CATCH_UP
    assert runs[0] == until - timedelta(minutes=MAX_CATCH_UP - 1) and runs[-1] == until
    assert runs == sorted(set(runs))
    few = runs_between(s, until - timedelta(minutes=3), until)
    assert few == [until - timedelta(minutes=2), until - timedelta(minutes=1), until]


def test_next_run_of_each_schedule() -> None:
    a = every5(name="a")
    b = Schedule("0 9 * * *", topic="tick", name="b", tz="Europe/Berlin")
    now = utc(2026, 1, 1, 12, 5)
    assert [next_run(s, now) for s in (a, b)] == [utc(2026, 1, 1, 12, 10), utc(2026, 1, 2, 8)]


def test_time_zone_shifts_the_runs() -> None:
    """09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC in summer."""
    s = Schedule("0 9 * * *", topic="tick", tz="Europe/Berlin")
    assert latest_run(s, utc(2026, 1, 15, 12)) == utc(2026, 1, 15, 8)
    assert latest_run(s, utc(2026, 7, 15, 12)) == utc(2026, 7, 15, 7)
    ny = Schedule("0 9 * * *", topic="tick", tz="America/New_York")
    assert latest_run(ny, utc(2026, 1, 15, 16)) == utc(2026, 1, 15, 14)
    assert Schedule("0 9 * * *", topic="tick").tz == "UTC"  # UTC is the default
    assert latest_run(Schedule("0 9 * * *", topic="tick"), utc(2026, 1, 15, 12)) == utc(
        2026, 1, 15, 9
    )


def test_dst_spring_forward_in_berlin_runs_a_missing_local_time_once() -> None:
    """29 March 2026, 02:00 CET → 03:00 CEST: 02:30 does not exist; it runs once, at 03:00."""
    s = Schedule("30 2 * * *", topic="tick", tz="Europe/Berlin")
    runs = runs_between(s, utc(2026, 3, 27), utc(2026, 3, 31))
    assert runs == [
        utc(2026, 3, 27, 1, 30),
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1),
        utc(2026, 3, 30, 0, 30),
    ]
    hourly = Schedule("0 * * * *", topic="tick", tz="Europe/Berlin")
    day = runs_between(hourly, utc(2026, 3, 28, 23), utc(2026, 3, 29, 22))  # local day
    assert len(day) == 23 and len(set(day)) == 23  # a 23-hour day


def test_dst_fall_back_in_berlin_runs_every_hour_once_and_a_daily_job_once() -> None:
    """25 October 2026, 03:00 CEST → 02:00 CET: the hour 02:00–03:00 happens twice."""
    hourly = Schedule("0 * * * *", topic="tick", tz="Europe/Berlin")
    day = runs_between(hourly, utc(2026, 10, 24, 22), utc(2026, 10, 25, 23))
    assert len(day) == 25 and day == sorted(set(day))  # a 25-hour day, each hour once
    assert utc(2026, 10, 25, 0) in day and utc(2026, 10, 25, 1) in day  # 02:00 CEST and CET
    daily = Schedule("30 2 * * *", topic="tick", tz="Europe/Berlin")
    assert runs_between(daily, utc(2026, 10, 24, 12), utc(2026, 10, 25, 12)) == [
        utc(2026, 10, 25, 0, 30)
    ]


@pytest.mark.parametrize("cron", ["0 * * * *", "*/20 * * * *", "30 2 * * *", "15 1-3 * * *"])
@pytest.mark.parametrize(
    "change", [utc(2026, 3, 29, 1), utc(2026, 10, 25, 1)], ids=["spring", "fall"]
)
def test_latest_run_agrees_with_runs_between_across_dst(cron: str, change: datetime) -> None:
    """Minute by minute around a DST change: latest_run is the last run of runs_between.

    cronsim's reverse iteration alone lands an hour (or a day) early inside the
    repeated hour; latest_run must not, or the scheduler would skip that run.
    """
    s = Schedule(cron, topic="tick", tz="Europe/Berlin")
    for minute in range(-150, 150):
        now = change + timedelta(minutes=minute, seconds=17)
        expected = (
            runs_between(s, now - timedelta(hours=2), now)
            or runs_between(s, now - timedelta(days=1), now)
        )[-1]
        got = latest_run(s, now)
        assert got == expected, f"at {now}: latest_run {got}, runs_between {expected}"
        assert got is not None and got <= now


def test_a_second_before_a_fall_back_is_not_an_hour_later() -> None:
    """02:59:59.5 CEST plus a second is 02:00:00.5 CET, not 03:00 CET (wall-clock arithmetic)."""
    hourly = Schedule("0 * * * *", topic="tick", tz="Europe/Berlin")
    now = utc(2026, 10, 25, 0, 59, 59) + timedelta(microseconds=500_000)
    assert latest_run(hourly, now) == utc(2026, 10, 25, 0)


# -- registration -----------------------------------------------------------------------------


def queue() -> Queue:
    return Queue(InMemoryStore())


def test_queue_periodic_registers_a_schedule() -> None:
    q = queue()
    s = q.periodic("*/5 * * * *", topic="report.hourly", payload={"a": 1})
    assert (s.cron, s.topic, s.payload, s.tz, s.missed, s.priority) == (
        "*/5 * * * *",
        "report.hourly",
        {"a": 1},
        "UTC",
        "latest",
        0,
    )
    assert s.name == "report.hourly@*/5 * * * *"
    assert q.schedules == [s]
    t = q.periodic(
        "0 9 * * 1-5",
        topic="report.daily",
        name="weekday-report",
        tz="Europe/Berlin",
        missed="all",
        priority=5,
    )
    assert q.schedules == [s, t] and t.name == "weekday-report"
    assert t.job_for(utc(2026, 1, 5, 8)) == Job(
        "report.daily",
        None,
        idempotency_key="periodic:weekday-report:2026-01-05T08:00:00+00:00",
        available_at=utc(2026, 1, 5, 8),
        priority=5,
    )


@pytest.mark.parametrize(
    "cron",
    [
        "*/5 * * *",
        "* * * * * *",
        "61 * * * *",
        "* 24 * * *",
        "bogus",
        "",
        "@hourly",
        "0 0 31 2 *",
    ],
)
def test_invalid_cron_is_rejected(cron: str) -> None:
    with pytest.raises(InvalidJob, match=r"cron|fields"):
        queue().periodic(cron, topic="tick")


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "utc+1", "../etc/passwd"])
def test_unknown_time_zone_is_rejected(tz: str) -> None:
    with pytest.raises(InvalidJob, match="time zone"):
        queue().periodic("* * * * *", topic="tick", tz=tz)


@pytest.mark.parametrize(
    "kw",
    [
        {"missed": "some"},
        {"priority": True},
        {"priority": 40_000},
        {"payload": {1, 2}},
        {"payload": float("nan")},
        {"name": "x" * 600},
        {"name": 5},
    ],
)
def test_invalid_schedule_options_are_rejected_at_registration(kw: dict[str, Any]) -> None:
    """Not later, in the supervisor, at every run."""
    with pytest.raises(InvalidJob):
        queue().periodic("* * * * *", topic="tick", **kw)


def test_duplicate_schedule_names_are_rejected() -> None:
    q = queue()
    q.periodic("*/5 * * * *", topic="tick")
    with pytest.raises(InvalidJob, match="already exists"):
        q.periodic("*/5 * * * *", topic="tick", payload="other")
    q.periodic("*/5 * * * *", topic="tick", name="second")  # an explicit name is fine
    with pytest.raises(InvalidJob, match="already exists"):
        q.periodic("0 * * * *", topic="other", name="second")
    q.periodic("*/5 * * * *", topic="other")  # same cron, other topic: another default name
    assert len(q.schedules) == 3


def test_check_schedule_accepts_cronsim_extensions() -> None:
    check_schedule(Schedule("0 0 L * *", topic="tick"))  # last day of the month
    check_schedule(Schedule("0 9 * * MON-FRI", topic="tick", tz="Asia/Kolkata"))


# -- the scheduler over the fake store --------------------------------------------------------


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


def scheduler_on(store: InMemoryStore, *schedules: Schedule) -> PeriodicScheduler:
    """What a supervisor builds: a scheduler writing through the store."""
    return PeriodicScheduler(list(schedules), store.enqueue_many, store.last_scheduled_run)


def run_times(store: InMemoryStore, schedule: Schedule | None = None) -> list[datetime]:
    rows = [
        r
        for r in store.rows.values()
        if r.idempotency_key
        and (schedule is None or r.idempotency_key.startswith(schedule.key_prefix))
    ]
    return sorted(r.available_at for r in rows)


def expected_runs(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The latest run at start (missed="latest"), then every run up to end."""
    first = latest_run(schedule, start)
    assert first is not None
    return [first, *runs_between(schedule, first, end)]


def test_each_run_is_enqueued_once_over_a_simulated_hour() -> None:
    start = utc(2026, 1, 1, 10, 2, 17)
    clock = Clock(start)
    store = InMemoryStore(clock)
    s = every5()
    scheduler = scheduler_on(store, s)
    rng = random.Random(8)
    created = []
    while clock.now < start + timedelta(hours=1):
        created += [e.run for e in scheduler.run_once(clock.now) if e.result.created]
        clock.now += timedelta(seconds=rng.randint(1, 90))
    clock.now = start + timedelta(hours=1)
    created += [e.run for e in scheduler.run_once(clock.now) if e.result.created]
    expected = expected_runs(s, start, clock.now)
    assert len(expected) == 13  # 10:00 (the latest at start), 10:05 … 11:00
    assert created == expected
    assert run_times(store) == expected
    job = next(iter(store.rows.values()))
    assert (job.topic, job.state, job.priority) == ("tick", State.PENDING, 0)


def test_two_schedulers_on_one_store_enqueue_each_run_once() -> None:
    """Two supervisors: both try every run; the idempotency key keeps one row per run."""
    start = utc(2026, 1, 1, 10, 0, 0)
    clock = Clock(start)
    store = InMemoryStore(clock)
    s = every5()
    a, b = scheduler_on(store, s), scheduler_on(store, s)
    rng = random.Random(3)
    attempts: Counter[datetime] = Counter()
    created: Counter[datetime] = Counter()
    while clock.now <= start + timedelta(hours=1):
        for sched in rng.sample([a, b], k=rng.choice([1, 2])):
            for e in sched.run_once(clock.now):
                attempts[e.run] += 1
                created[e.run] += e.result.created
        clock.now += timedelta(seconds=rng.randint(10, 90))
    for sched in (a, b):
        for e in sched.run_once(clock.now):
            attempts[e.run] += 1
            created[e.run] += e.result.created
    expected = expected_runs(s, start, clock.now)
    assert sorted(created) == expected and set(created.values()) == {1}
    assert run_times(store) == expected
    assert max(attempts.values()) == 2  # the other one tried too, and found the row


def test_a_failed_enqueue_is_retried_on_the_next_tick() -> None:
    store = InMemoryStore(Clock(utc(2026, 1, 1)))
    s = every5()
    down = [False]

    def enqueue(jobs: Any) -> Any:
        if down[0]:
            raise StoreUnavailable("database is down")
        return store.enqueue_many(jobs)

    scheduler = PeriodicScheduler([s], enqueue, store.last_scheduled_run)
    assert [e.run for e in scheduler.run_once(utc(2026, 1, 1, 10, 0, 10))] == [
        utc(2026, 1, 1, 10)
    ]  # the first tick works
    down[0] = True
    with pytest.raises(StoreUnavailable):
        scheduler.run_once(utc(2026, 1, 1, 10, 5, 1))
    down[0] = False
    assert [e.run for e in scheduler.run_once(utc(2026, 1, 1, 10, 5, 2))] == [
        utc(2026, 1, 1, 10, 5)
    ]
    assert run_times(store) == [utc(2026, 1, 1, 10), utc(2026, 1, 1, 10, 5)]


def test_a_clock_going_back_does_not_enqueue_again() -> None:
    store = InMemoryStore(Clock(utc(2026, 1, 1)))
    scheduler = scheduler_on(store, every5())
    assert len(scheduler.run_once(utc(2026, 1, 1, 10, 10, 1))) == 1
    assert scheduler.run_once(utc(2026, 1, 1, 10, 5, 1)) == []  # NTP stepped the clock back
    assert scheduler.run_once(utc(2026, 1, 1, 10, 10, 30)) == []
    assert [e.run for e in scheduler.run_once(utc(2026, 1, 1, 10, 15))] == [utc(2026, 1, 1, 10, 15)]


def test_several_schedules_each_get_their_runs() -> None:
    store = InMemoryStore(Clock(utc(2026, 1, 1)))
    a = every5(name="a")
    b = Schedule("0 * * * *", topic="other", name="b", payload={"x": 1}, priority=3)
    scheduler = scheduler_on(store, a, b)
    t = utc(2026, 1, 1, 10, 0, 1)
    while t <= utc(2026, 1, 1, 12, 0, 1):
        scheduler.run_once(t)
        t += timedelta(seconds=30)
    assert len(run_times(store, a)) == 25 and len(run_times(store, b)) == 3
    row = next(r for r in store.rows.values() if r.topic == "other")
    assert (row.payload, row.priority) == ({"x": 1}, 3)


def test_the_dst_fall_back_day_enqueues_every_hourly_run_once() -> None:
    """Steady running through the repeated hour: 25 runs on a 25-hour day, none lost."""
    s = Schedule("0 * * * *", topic="tick", tz="Europe/Berlin")
    store = InMemoryStore(Clock(utc(2026, 10, 24)))
    scheduler = scheduler_on(store, s)
    t = utc(2026, 10, 24, 22, 0, 30)  # 00:00:30 CEST
    while t < utc(2026, 10, 25, 23):  # 00:00 CET the next day
        scheduler.run_once(t)
        t += timedelta(minutes=1)
    runs = run_times(store)
    assert len(runs) == 25 and runs == [
        utc(2026, 10, 24, 22) + timedelta(hours=h) for h in range(25)
    ]


# -- restarts: the missed-run policy ----------------------------------------------------------


def lifetime(
    store: InMemoryStore,
    schedule: Schedule,
    start: datetime,
    minutes: int,
    step: timedelta = timedelta(seconds=20),
) -> list[datetime]:
    """One scheduler (one supervisor) running from ``start``: the runs it created."""
    scheduler = scheduler_on(store, schedule)
    created = []
    t = start
    while t <= start + timedelta(minutes=minutes):
        created += [e.run for e in scheduler.run_once(t) if e.result.created]
        t += step
    return created


@pytest.mark.parametrize("missed", ["latest", "all", "skip"])
def test_restart_after_downtime_follows_the_missed_policy(missed: str) -> None:
    s = every5(missed=missed)
    store = InMemoryStore(Clock(utc(2026, 1, 1)))
    first = lifetime(store, s, utc(2026, 1, 1, 10, 0, 1), minutes=20)
    before = 4 if missed == "skip" else 5  # skip: not even the run due at the first start
    assert len(first) == before and first[-1] == utc(2026, 1, 1, 10, 20)
    # Three hours of downtime; the new scheduler's first tick:
    restart = utc(2026, 1, 1, 13, 22, 40)
    scheduler = scheduler_on(store, s)
    burst = [e.run for e in scheduler.run_once(restart) if e.result.created]
    if missed == "latest":
        assert burst == [utc(2026, 1, 1, 13, 20)]  # one job, not a burst
    elif missed == "all":
        assert burst == runs_between(s, utc(2026, 1, 1, 10, 20), restart)
        assert len(burst) == 36 and burst[0] == utc(2026, 1, 1, 10, 25)
    else:
        assert burst == []
    # Afterwards, every run again, once.
    assert [e.run for e in scheduler.run_once(restart + timedelta(minutes=3))] == [
        utc(2026, 1, 1, 13, 25)
    ]
    assert scheduler.run_once(restart + timedelta(minutes=3, seconds=30)) == []


def test_restart_with_missed_all_is_capped_at_a_hundred_runs() -> None:
    s = every5(missed="all")
    store = InMemoryStore(Clock(utc(2026, 1, 1)))
    lifetime(store, s, utc(2026, 1, 1, 10, 0, 1), minutes=1)
    restart = utc(2026, 1, 2, 10, 0, 1)  # a day later: 288 runs missed
    runs = [e.run for e in scheduler_on(store, s).run_once(restart)]
    assert len(runs) == MAX_CATCH_UP
    assert runs[-1] == utc(2026, 1, 2, 10) and runs[0] == utc(2026, 1, 2, 10) - timedelta(
        minutes=5 * (MAX_CATCH_UP - 1)
    )


def test_restart_with_missed_all_and_no_earlier_run_enqueues_only_the_latest() -> None:
    s = every5(missed="all")
    store = InMemoryStore(Clock(utc(2026, 1, 1)))
    runs = [e.run for e in scheduler_on(store, s).run_once(utc(2026, 1, 1, 10, 7))]
    assert runs == [utc(2026, 1, 1, 10, 5)]  # a first deployment does not replay history


def test_restart_without_downtime_enqueues_nothing_new() -> None:
    """A rolling restart: the latest run is already in the table, so it is not run again."""
    s = every5()
    store = InMemoryStore(Clock(utc(2026, 1, 1)))
    lifetime(store, s, utc(2026, 1, 1, 10, 0, 1), minutes=7)
    again = scheduler_on(store, s).run_once(utc(2026, 1, 1, 10, 8))
    assert [(e.run, e.result.created) for e in again] == [(utc(2026, 1, 1, 10, 5), False)]


def test_retention_caveat_a_deleted_latest_run_is_enqueued_again_at_restart() -> None:
    """The documented caveat: the run's row is the only memory of it. If retention
    deleted it (a schedule sparser than the retention TTL), a restart runs it again."""
    s = Schedule("0 0 1 * *", topic="tick")  # monthly
    clock = Clock(utc(2026, 1, 1, 0, 0, 5))
    store = InMemoryStore(clock)
    (first,) = scheduler_on(store, s).run_once(clock.now)
    assert first.result.created
    claimed = store.claim("w", ["tick"], timedelta(minutes=1))
    assert claimed is not None
    from brooq.engine.outcome import DONE

    assert store.settle(claimed.ticket, DONE)
    clock.now = utc(2026, 1, 20)
    assert scheduler_on(store, s).run_once(clock.now)[0].result.created is False  # kept
    store.delete_terminal(timedelta(days=7), batch=100)  # retention TTL of a week
    again = scheduler_on(store, s).run_once(clock.now)
    assert [(e.run, e.result.created) for e in again] == [(utc(2026, 1, 1), True)]


# -- the status view --------------------------------------------------------------------------


def test_schedules_table_lists_each_schedule_with_its_next_run() -> None:
    from brooq.cli.schedules import render_schedules, schedules_table

    q = queue()
    assert schedules_table(q, utc(2026, 1, 1)) == []
    assert render_schedules([]) == "schedules: none"
    q.periodic("*/5 * * * *", topic="report.tick")
    q.periodic(
        "0 9 * * 1-5",
        topic="report.daily",
        name="weekday",
        tz="Europe/Berlin",
        missed="skip",
        priority=2,
    )
    rows = schedules_table(q, utc(2026, 1, 2, 12, 7))  # a Friday
    assert rows == [
        {
            "name": "report.tick@*/5 * * * *",
            "cron": "*/5 * * * *",
            "tz": "UTC",
            "topic": "report.tick",
            "missed": "latest",
            "priority": 0,
            "next_run": "2026-01-02T12:10:00+00:00",
            "next_run_local": "2026-01-02T12:10:00+00:00",
        },
        {
            "name": "weekday",
            "cron": "0 9 * * 1-5",
            "tz": "Europe/Berlin",
            "topic": "report.daily",
            "missed": "skip",
            "priority": 2,
            "next_run": "2026-01-05T08:00:00+00:00",
            "next_run_local": "2026-01-05T09:00:00+01:00",
        },
    ]
    text = render_schedules(rows).splitlines()
    assert text[0] == "schedules:" and text[1].split() == [
        "name",
        "cron",
        "tz",
        "topic",
        "missed",
        "next_run",
    ]
    assert "weekday" in text[3] and "2026-01-05T08:00:00+00:00" in text[3]
