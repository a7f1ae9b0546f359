"""The heartbeat of the supervisor (LeaseKeeper) on an inline database: no threads, no sleeps."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

from brooq.engine.store import Ticket
from brooq.supervisor.database import InlineDatabase
from brooq.supervisor.leases import RETRY_S, Held, Holdings, LeaseKeeper
from brooq.vocabulary import StoreUnavailable

LEASE = timedelta(seconds=12)


class FlakyStore:
    """A store whose heartbeat fails (a connection cut as stuck) until told otherwise."""

    def __init__(self) -> None:
        self.failing = True
        self.sent = 0

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        self.sent += 1
        if self.failing:
            raise StoreUnavailable("database unavailable: server closed the connection")
        return {t.job_id for t in tickets}


def test_a_failed_heartbeat_is_retried_within_a_second_not_a_lease_third_later() -> None:
    """Before, the next try came lease/3 later: with one stuck statement (cut after 2 s) the
    leases came within lease/3 of their end and every running job was interrupted."""
    store, holdings, lost = FlakyStore(), Holdings(), list[Held]()
    keeper = LeaseKeeper(store, InlineDatabase(), holdings, LEASE, lost.append)  # type: ignore[arg-type]
    now = time.monotonic()
    holdings.add(Ticket("j1", "host:1:abcd", 1), "work", now + LEASE.total_seconds())
    assert keeper.run_once(now) and store.sent == 1
    retry_at = keeper.every.next_at
    assert retry_at <= time.monotonic() + RETRY_S
    assert not keeper.run_once(now + 0.5)
    store.failing = False
    assert keeper.run_once(retry_at) and store.sent == 2
    assert holdings.jobs["j1"].lease_end == retry_at + LEASE.total_seconds()
    assert keeper.every.next_at == retry_at + LEASE.total_seconds() / 3  # back on its period
    assert lost == []


def test_after_a_success_the_heartbeat_keeps_its_period() -> None:
    store, holdings = FlakyStore(), Holdings()
    store.failing = False
    keeper = LeaseKeeper(store, InlineDatabase(), holdings, LEASE, lambda held: None)  # type: ignore[arg-type]
    holdings.add(Ticket("j1", "host:1:abcd", 1), "work", 100.0)
    assert keeper.run_once(50.0)
    assert not keeper.run_once(50.0 + LEASE.total_seconds() / 3 - 0.01)
    assert keeper.run_once(50.0 + LEASE.total_seconds() / 3)
