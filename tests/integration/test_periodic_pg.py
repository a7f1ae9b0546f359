"""Periodic schedules on real PostgreSQL: two schedulers (two supervisors) on one database.

One injected clock drives both over a simulated hour in random steps and
random interleavings, sometimes at the same instant in two threads; each run
must come out as exactly one row. Then the missed-run policy across a
simulated downtime between two scheduler lifetimes.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import psycopg
import pytest

from brooq.engine.periodic import Enqueue, PeriodicScheduler, latest_run, runs_between
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Schedule

START = datetime(2026, 1, 1, 10, 2, 17, tzinfo=UTC)


class Supervisors:
    """Two schedulers, each with its own store (its own connection), like two supervisors."""

    def __init__(self, dsn: str, schedule: Schedule) -> None:
        self.stores = [PostgresStore(dsn), PostgresStore(dsn)]
        self.schedulers = [
            PeriodicScheduler([schedule], s.enqueue_many, s.last_scheduled_run) for s in self.stores
        ]
        self.attempts: Counter[datetime] = Counter()
        self.created: Counter[datetime] = Counter()

    def record(self, done: list[Enqueue]) -> None:
        for e in done:
            self.attempts[e.run] += 1
            self.created[e.run] += e.result.created

    def tick(self, now: datetime, rng: random.Random) -> None:
        """One step: one of them, both in some order, or both at once in two threads."""
        how = rng.choice(["one", "both", "concurrent"])
        if how == "one":
            self.record(rng.choice(self.schedulers).run_once(now))
        elif how == "both":
            for sched in rng.sample(self.schedulers, k=2):
                self.record(sched.run_once(now))
        else:
            self.concurrent(now)

    def concurrent(self, now: datetime) -> None:
        results: list[list[Enqueue]] = [[], []]
        errors: list[BaseException] = []
        start = threading.Barrier(2, timeout=10)

        def run(i: int) -> None:
            try:
                start.wait()
                results[i] = self.schedulers[i].run_once(now)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)
        for r in results:
            self.record(r)

    def close(self) -> None:
        for s in self.stores:
            s.close()


@pytest.fixture
def supervisors(dsn: str) -> Iterator[Any]:
    made: list[Supervisors] = []

    def make(schedule: Schedule) -> Supervisors:
        made.append(Supervisors(dsn, schedule))
        return made[-1]

    yield make
    for sup in made:
        sup.close()


def rows(pg: psycopg.Connection[Any], schedule: Schedule) -> list[tuple[datetime, int]]:
    """(run time, rows with it) for the schedule's jobs, by run time."""
    return [
        (r[0], r[1])
        for r in pg.execute(
            "SELECT available_at, count(*) FROM job WHERE topic = %s AND idempotency_key LIKE %s "
            "GROUP BY available_at ORDER BY available_at",
            (schedule.topic, schedule.key_prefix + "%"),
        )
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_supervisors_over_a_simulated_hour_enqueue_each_run_once(
    supervisors: Any, pg: psycopg.Connection[Any], seed: int
) -> None:
    schedule = Schedule("*/5 * * * *", topic="report.tick", payload={"seed": seed})
    sup = supervisors(schedule)
    rng = random.Random(seed)
    end = START + timedelta(hours=1)
    now = START
    while now < end:
        sup.tick(now, rng)
        now = min(now + timedelta(seconds=rng.randint(10, 90)), end)
    sup.concurrent(end)  # both see the end of the hour

    # 10:00 (the latest run when they start at 10:02:17), then 10:05 … 11:00.
    expected = [latest_run(schedule, START), *runs_between(schedule, START, end)]
    assert len(expected) == 13
    assert expected[0] == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert expected[-1] == datetime(2026, 1, 1, 11, tzinfo=UTC)
    assert rows(pg, schedule) == [(run, 1) for run in expected]
    assert sorted(sup.created) == expected and set(sup.created.values()) == {1}
    total = pg.execute("SELECT count(*), count(DISTINCT idempotency_key) FROM job").fetchone()
    assert total == (13, 13)
    # Both really tried: some runs were attempted twice, and found the other's row.
    assert max(sup.attempts.values()) == 2


@pytest.mark.parametrize("missed", ["latest", "all", "skip"])
def test_missed_runs_across_three_hours_of_downtime(
    supervisors: Any, pg: psycopg.Connection[Any], missed: Literal["latest", "all", "skip"]
) -> None:
    schedule = Schedule("*/5 * * * *", topic="report.tick", missed=missed)
    rng = random.Random(missed)
    first = supervisors(schedule)
    now = START
    while now < START + timedelta(minutes=20):
        first.tick(now, rng)
        now += timedelta(seconds=rng.randint(10, 90))
    first.close()
    before = rows(pg, schedule)
    assert before[-1][0] <= now and all(n == 1 for _, n in before)
    last_before = before[-1][0]

    # Three hours without any supervisor; then two new ones start.
    restart = now + timedelta(hours=3)
    second = supervisors(schedule)
    second.concurrent(restart)
    after = rows(pg, schedule)
    new = [run for run, _ in after if run > last_before]
    assert all(n == 1 for _, n in after)
    if missed == "latest":
        assert new == [latest_run(schedule, restart)]  # one job, not a burst
    elif missed == "all":
        assert new == runs_between(schedule, last_before, restart)
        assert len(new) == 36
    else:
        assert new == []
    # Afterwards every run once, whatever the policy.
    t = restart
    while t < restart + timedelta(minutes=15):
        t += timedelta(seconds=rng.randint(10, 90))
        second.tick(t, rng)
    later = [run for run, _ in rows(pg, schedule) if run > restart]
    assert later == runs_between(schedule, restart, t)
    assert all(n == 1 for _, n in rows(pg, schedule))


def test_last_scheduled_run_reads_only_this_schedules_rows(
    supervisors: Any, pg: psycopg.Connection[Any]
) -> None:
    """The key prefix is matched literally: a name with % or _ does not match others."""
    a = Schedule("*/5 * * * *", topic="tick", name="a_b")
    b = Schedule("0 * * * *", topic="tick", name="aXb")
    c = Schedule("0 * * * *", topic="tick", name="a%")
    store = supervisors(a).stores[0]
    store.enqueue_many(
        [
            a.job_for(datetime(2026, 1, 1, 10, 5, tzinfo=UTC)),
            b.job_for(datetime(2026, 1, 1, 11, tzinfo=UTC)),
            c.job_for(datetime(2026, 1, 1, 12, tzinfo=UTC)),
        ]
    )
    assert store.last_scheduled_run(a) == datetime(2026, 1, 1, 10, 5, tzinfo=UTC)
    assert store.last_scheduled_run(b) == datetime(2026, 1, 1, 11, tzinfo=UTC)
    assert store.last_scheduled_run(c) == datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert store.last_scheduled_run(Schedule("* * * * *", topic="tick", name="z")) is None
