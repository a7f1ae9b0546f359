"""The heartbeat's retry after a failure (LeaseKeeper), on an inline database and a given clock."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from brooq.engine.store import Ticket
from brooq.engine.timer import Every
from brooq.supervisor.database import InlineDatabase
from brooq.supervisor.leases import RETRY_S, Holdings, LeaseKeeper
from brooq.vocabulary import StoreUnavailable

LEASE = timedelta(seconds=12)
PERIOD = LEASE.total_seconds() / 3


class FlakyStore:
    """A store whose heartbeat fails (a connection cut as stuck) while ``failing``."""

    def __init__(self) -> None:
        self.failing = True
        self.sent: list[float] = []
        self.clock = 0.0

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        self.sent.append(self.clock)
        if self.failing:
            raise StoreUnavailable("database unavailable: server closed the connection")
        return {t.job_id for t in tickets}


def keeper_with_one_job(store: FlakyStore) -> tuple[LeaseKeeper, Holdings]:
    holdings = Holdings()
    holdings.add(Ticket("j1", "host:1:abcd", 1), "work", 100.0 + LEASE.total_seconds())
    keeper = LeaseKeeper(store, InlineDatabase(), holdings, LEASE, lambda held: None)  # type: ignore[arg-type]
    return keeper, holdings


def beat(keeper: LeaseKeeper, store: FlakyStore, now: float) -> bool:
    store.clock = now
    return keeper.run_once(now)


def test_a_failed_heartbeat_is_retried_within_a_second_not_a_period_later() -> None:
    """Before, the next try came lease/3 later: after one statement cut as stuck (2 s) the
    leases were within lease/3 of their end by then, and every running job was interrupted."""
    store = FlakyStore()
    keeper, holdings = keeper_with_one_job(store)
    assert beat(keeper, store, 100.0)  # fails
    assert not beat(keeper, store, 102.0)  # the failure is seen here: retry at 103
    assert not beat(keeper, store, 102.9)
    store.failing = False
    assert beat(keeper, store, 102.0 + RETRY_S)
    assert store.sent == [100.0, 103.0]
    assert holdings.jobs["j1"].lease_end == 103.0 + LEASE.total_seconds()
    assert not beat(keeper, store, 103.0 + PERIOD - 0.01)  # back on its period
    assert beat(keeper, store, 103.0 + PERIOD)
    assert keeper.expiring(103.0 + PERIOD, within=PERIOD) == []


def test_heartbeats_that_keep_failing_are_retried_once_a_second_at_most() -> None:
    store = FlakyStore()
    keeper, _ = keeper_with_one_job(store)
    for t in (100.0, 100.1, 100.5, 101.0, 101.5, 102.0, 102.6, 103.0):
        beat(keeper, store, t)
    # Each failure is seen at the next tick, the retry is due a second later.
    assert store.sent == [100.0, 101.5, 103.0]


def test_retry_within_never_postpones() -> None:
    every = Every(timedelta(seconds=4))
    assert every.due(10.0)
    every.retry_within(10.5, 1.0)
    assert every.next_at == 11.5
    every.retry_within(10.6, 10.0)
    assert every.next_at == 11.5
