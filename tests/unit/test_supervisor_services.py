"""The supervisor's services, driven directly through ``run_once``: no processes, no database.

Each service hands its statements to a :class:`Database`; here that is an
:class:`InlineDatabase` that keeps the tasks until the test lets them finish,
and the store is the in-memory one, so every decision is checked without
PostgreSQL (its SQL is covered by the integration contract suite).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brooq.engine.fake import InMemoryStore
from brooq.engine.outcome import DONE, Outcome, SettleKind
from brooq.engine.store import Claimed, Ticket
from brooq.supervisor import completer as completer_mod
from brooq.supervisor import orphans, surface
from brooq.supervisor.children import ChildProcess, Interrupt, Kill, Running
from brooq.supervisor.completer import Completer, Pending
from brooq.supervisor.database import Done
from brooq.supervisor.leases import Held, Holdings, LeaseKeeper
from brooq.supervisor.producer import RATE_STALE_S, Producer
from brooq.vocabulary import Job, KindOptions, State

LEASE = timedelta(seconds=30)
HOLDER = "host:1:abc"
GROUP = ("a",)


class InlineDatabase:
    """A Database whose tasks wait until :meth:`finish` (or fail with :meth:`fail`)."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, Callable[[], Any], Done]] = []

    def submit(self, name: str, run: Callable[[], Any], done: Done) -> None:
        self.tasks.append((name, run, done))

    def busy(self, name: str) -> bool:
        return any(n == name or n.startswith(name + ":") for n, _, _ in self.tasks)

    def idle(self) -> bool:
        return not self.tasks

    def finish(self) -> int:
        """Run every queued task, in order, and hand back its result; how many ran."""
        tasks, self.tasks = self.tasks, []
        for _, run, done in tasks:
            done(run(), None)
        return len(tasks)

    def fail(self, error: BaseException) -> int:
        """Fail every queued task with ``error`` without running it."""
        tasks, self.tasks = self.tasks, []
        for _, _, done in tasks:
            done(None, error)
        return len(tasks)


def enqueue(store: InMemoryStore, n: int, topic: str = "a") -> list[str]:
    return [e.id for e in store.enqueue_many([Job(topic, {"i": i}) for i in range(n)])]


def producer(
    store: InMemoryStore,
    db: InlineDatabase,
    prefetch: int = 4,
    limits: dict[str, int] | None = None,
    claimed: list[Claimed] | None = None,
    groups: tuple[tuple[str, ...], ...] = (GROUP,),
) -> Producer:
    sink = claimed if claimed is not None else []
    return Producer(
        store,
        db,
        HOLDER,
        LEASE,
        list(groups),
        limits or {},
        prefetch,
        timedelta(milliseconds=100),
        max_wait=1.0,
        on_claimed=lambda c, _end: sink.extend(c),
    )


# --- producer ----------------------------------------------------------------------------


def test_a_cold_group_claims_only_for_its_idle_workers() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    enqueue(store, 20)
    p = producer(store, db)
    assert p.run_once(0.0, {GROUP: 3}, {GROUP: 8}) == 1
    db.finish()
    assert len(list(p.buffered())) == 3  # nobody has finished a job yet: no prefetch


def test_a_group_that_turns_jobs_over_keeps_jobs_ahead_of_its_workers() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    enqueue(store, 100)
    p = producer(store, db, prefetch=4)
    p.finished(GROUP, 10.0)
    p.run_once(10.0, {GROUP: 2}, {GROUP: 8})
    db.finish()
    assert len(list(p.buffered())) == 2 + 4


def test_fast_handlers_get_a_deeper_buffer_than_prefetch_bounded() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    p = producer(store, db, prefetch=4)
    state = p.groups[GROUP]
    for i in range(1000):
        p.finished(GROUP, 1.0 + i * 0.0005)  # 2,000 jobs a second
    state.round_trip = 0.005
    depth = p.depth(state, 8, 1.5)
    assert 80 < depth <= 1000  # what they finish in 50 ms, at least
    assert p.depth(state, 8, 1.5 + RATE_STALE_S + 0.1) == 0  # stopped turning over


def test_slow_turnover_keeps_a_shallow_buffer() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    p = producer(store, db, prefetch=2)
    state = p.groups[GROUP]
    for i in range(20):
        p.finished(GROUP, 1.0 + i * 0.2)  # 5 jobs a second (workers that recycle, say)
    assert p.depth(state, 8, 5.0) == 2  # the prefetch: not 50 ms of a fast group's work


def test_prefetch_zero_claims_only_for_idle_workers() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    enqueue(store, 20)
    p = producer(store, db, prefetch=0)
    p.finished(GROUP, 1.0)
    p.run_once(1.0, {GROUP: 2}, {GROUP: 8})
    db.finish()
    assert len(list(p.buffered())) == 2


def test_one_claim_in_flight_per_group() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    enqueue(store, 20)
    p = producer(store, db)
    assert p.run_once(0.0, {GROUP: 1}, {GROUP: 1}) == 1
    assert p.run_once(0.0, {GROUP: 1}, {GROUP: 1}) == 0
    assert p.claiming()


def test_a_capped_topic_is_never_claimed_beyond_its_cap_buffer_included() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    enqueue(store, 20)
    p = producer(store, db, prefetch=8, limits={"a": 2})
    p.finished(GROUP, 0.0)
    p.run_once(0.0, {GROUP: 8}, {GROUP: 8})
    db.finish()
    assert len(list(p.buffered())) == 2
    assert sum(1 for r in store.rows.values() if r.state is State.PROCESSING) == 2


def test_a_short_claim_waits_for_a_notify_or_the_poll() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    enqueue(store, 1)
    p = producer(store, db)
    p.run_once(0.0, {GROUP: 4}, {GROUP: 4})
    db.finish()
    p.take(GROUP)
    assert p.run_once(0.01, {GROUP: 4}, {GROUP: 4}) == 0  # nothing more was ready
    p.heard({"a"})
    assert p.run_once(0.02, {GROUP: 4}, {GROUP: 4}) == 1
    db.finish()
    assert p.run_once(0.5, {GROUP: 4}, {GROUP: 4}) == 1  # the poll interval passed


def test_a_failed_claim_backs_off_to_the_poll_interval() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    p = producer(store, db)
    p.run_once(0.0, {GROUP: 1}, {GROUP: 1})
    db.fail(ConnectionError("down"))
    assert p.run_once(0.05, {GROUP: 1}, {GROUP: 1}) == 0
    assert p.run_once(0.2, {GROUP: 1}, {GROUP: 1}) == 1


def test_buffer_order_put_back_drop_stale_and_drain() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    ids = enqueue(store, 3)
    p = producer(store, db)
    p.run_once(0.0, {GROUP: 3}, {GROUP: 3})
    db.finish()
    first = p.take(GROUP)
    assert first is not None and first.id == ids[0]
    p.put_back(GROUP, first, 0.5)
    taken = p.take(GROUP)
    assert taken is not None and taken.id == ids[0]  # a job given back goes first again
    assert p.drop(ids[1]) is not None and p.drop(ids[1]) is None
    p.put_back(GROUP, taken, 0.9)
    assert [c.id for c in p.stale(1.5)] == [ids[2]]  # waited since 0.0, more than 1 s
    assert [c.id for c in p.drain()] == [ids[0]]
    assert list(p.buffered()) == []


def test_jobs_wait_in_the_buffer_from_when_their_claim_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim slower than max_wait (a database under load) must not make its jobs stale
    on arrival, to be released before any worker could take them."""
    store, db = InMemoryStore(), InlineDatabase()
    ids = enqueue(store, 2)
    p = producer(store, db)
    clock = [time.monotonic()]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    p.run_once(0.0, {GROUP: 2}, {GROUP: 2})
    clock[0] += 2.0  # the claim takes 2 s: max_wait is 1 s
    db.finish()
    assert p.stale(2.5) == []
    assert [c.id for c in p.stale(3.5)] == ids


def test_claims_are_reported_once_with_their_jobs() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    enqueue(store, 5)
    seen: list[Claimed] = []
    p = producer(store, db, claimed=seen)
    p.run_once(0.0, {GROUP: 5}, {GROUP: 5})
    db.finish()
    assert sorted(c.id for c in seen) == sorted(c.id for c in p.buffered())


# --- completer -----------------------------------------------------------------------------


def claimed_tickets(store: InMemoryStore, n: int) -> list[Ticket]:
    enqueue(store, n)
    return [c.ticket for c in store.claim_many(HOLDER, ["a"], LEASE, n)]


def test_a_lone_outcome_waits_a_moment_for_company() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    written: list[Pending] = []
    c = Completer(store, db, lambda ok, lost: written.extend(ok))
    (ticket,) = claimed_tickets(store, 1)
    c.add(ticket, DONE, "a", 1.0)
    assert c.run_once(1.0) == 0
    assert c.next_flush_at() == pytest.approx(1.0 + completer_mod.FLUSH_EVERY_S)
    assert c.run_once(1.0 + completer_mod.FLUSH_EVERY_S) == 1
    db.finish()
    assert [p.ticket for p in written] == [ticket]
    assert store.get(ticket.job_id).state is State.DONE


def test_a_full_batch_goes_out_at_once_in_one_statement() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    c = Completer(store, db, lambda ok, lost: None)
    for ticket in claimed_tickets(store, completer_mod.FLUSH_AT):
        c.add(ticket, DONE, "a", 1.0)
    assert c.run_once(1.0) == completer_mod.FLUSH_AT
    assert len(db.tasks) == 1
    db.finish()
    assert all(r.state is State.DONE for r in store.rows.values())


def test_rows_that_lost_their_fence_are_reported_lost_not_written() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    lost: list[Pending] = []
    c = Completer(store, db, lambda ok, gone: lost.extend(gone))
    mine, stolen = claimed_tickets(store, 2)
    c.add(mine, DONE, "a", 0.0)
    c.add(Ticket(stolen.job_id, "another:2:xyz", stolen.attempt), DONE, "a", 0.0)
    c.run_once(1.0, force=True)
    db.finish()
    assert [p.ticket.job_id for p in lost] == [stolen.job_id]
    assert store.get(stolen.job_id).state is State.PROCESSING


def test_a_failed_flush_keeps_its_outcomes_first_in_line_and_retries_later() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    c = Completer(store, db, lambda ok, lost: None)
    first, second = claimed_tickets(store, 2)
    c.add(first, DONE, "a", 0.0)
    c.run_once(1.0, force=True)
    c.add(second, DONE, "a", 1.0)
    db.fail(ConnectionError("down"))
    assert [p.ticket for p in c.pending] == [first, second]
    assert c.run_once(1.1, force=True) == 0  # backing off
    assert c.run_once(1.0 + completer_mod.RETRY_AFTER_S, force=True) == 2
    db.finish()
    assert not c.pending and c.failures == 0


def test_the_oldest_unwritten_outcome_counts_the_flush_under_way_and_a_failed_one() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    c = Completer(store, db, lambda ok, lost: None)
    first, second = claimed_tickets(store, 2)
    assert c.oldest() is None
    c.add(first, DONE, "a", 1.0)
    c.run_once(2.0, force=True)
    c.add(second, DONE, "a", 3.0)
    assert c.oldest() == 1.0  # the flush under way holds the oldest
    db.fail(ConnectionError("cut as stuck"))
    assert c.oldest() == 1.0  # put back, first in line: still waiting since 1.0
    assert c.run_once(2.0 + completer_mod.RETRY_AFTER_S, force=True) == 2
    db.finish()
    assert c.oldest() is None


def test_healthz_fails_while_an_outcome_waits_too_long_to_be_written() -> None:
    child, _ = running_child()
    child.booted, child.closed = True, False
    late = surface.OUTCOMES_LATE_S
    assert surface.health(None, True, [child], 1, late - 0.1) == (True, "1 workers running")
    assert surface.health(None, True, [child], 1, late + 2.5) == (
        False,
        f"outcomes not written for {int(late + 2.5)}s",
    )
    assert surface.health(None, False, [child], 1, late + 2.5) == (False, "database unavailable")


def test_backpressure_when_the_database_falls_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(completer_mod, "MAX_PENDING", 3)
    store, db = InMemoryStore(), InlineDatabase()
    c = Completer(store, db, lambda ok, lost: None)
    for ticket in claimed_tickets(store, 3):
        c.add(ticket, Outcome(SettleKind.FAILED, "failed", timedelta(seconds=1)), "a", 0.0)
    assert c.full


# --- leases ----------------------------------------------------------------------------------


def test_heartbeat_extends_held_jobs_and_reports_the_ones_taken_away() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    holdings, lost = Holdings(), list[Held]()
    keep, gone = claimed_tickets(store, 2)
    holdings.add(keep, "a", 10.0)
    holdings.add(gone, "a", 10.0)
    store.cancel(gone.job_id)
    keeper = LeaseKeeper(store, db, holdings, LEASE, lost.append)
    assert keeper.run_once(100.0)
    assert not keeper.run_once(100.0)  # one heartbeat at a time
    db.finish()
    assert [h.ticket for h in lost] == [gone]
    held = holdings.get(keep.job_id)
    assert held is not None and held.lease_end == 100.0 + LEASE.total_seconds()


def test_failed_heartbeats_leave_leases_to_expire_by_the_supervisors_clock() -> None:
    store, db = InMemoryStore(), InlineDatabase()
    holdings = Holdings()
    (ticket,) = claimed_tickets(store, 1)
    holdings.add(ticket, "a", 30.0)
    keeper = LeaseKeeper(store, db, holdings, LEASE, lambda held: None)
    keeper.run_once(10.0)
    db.fail(ConnectionError("down"))
    assert keeper.expiring(15.0, within=10.0) == []
    assert [h.ticket for h in keeper.expiring(21.0, within=10.0)] == [ticket]


# --- orphans ---------------------------------------------------------------------------------


def running_child(
    kill: Kill | None = None, interrupted: Interrupt | None = None, attempt: int = 1
) -> tuple[ChildProcess, Running]:
    claimed = Claimed(Ticket("j1", HOLDER, attempt), "a", "{}", datetime.now(UTC))
    job = Running(claimed, 1, 0.0, 5.0, started=0.0, interrupted=interrupted)
    r, w = os.pipe()
    os.close(w)
    child = ChildProcess(
        slot=0,
        pid=1,
        group=GROUP,
        sock=r,
        started=0.0,
        generation=0,
        metrics_id="w0",
        kill=kill,
    )
    child.queue.append(job)
    child.close()
    return child, job


OPTIONS = KindOptions(
    max_attempts=2, backoff_base=timedelta(seconds=1), backoff_max=timedelta(seconds=10)
)
KILLED = signal.SIGKILL.value  # a wait status of "killed by SIGKILL"


@pytest.mark.parametrize(
    ("kill", "interrupted", "fate"),
    [
        (Kill.SHUTDOWN, None, orphans.Fate.RELEASE),
        (Kill.LEASE_ENDING, None, orphans.Fate.LEAVE),
        (None, Interrupt.CANCELED, orphans.Fate.LEAVE),
        (None, Interrupt.LEASE_LOST, orphans.Fate.LEAVE),
        (Kill.HUNG, Interrupt.ATTEMPT_TIMEOUT, orphans.Fate.RECORD),
        (Kill.MAX_EXECUTION, None, orphans.Fate.RECORD),
        (None, None, orphans.Fate.RECORD),
    ],
)
def test_the_fate_of_an_orphaned_job(
    kill: Kill | None, interrupted: Interrupt | None, fate: orphans.Fate
) -> None:
    child, job = running_child(kill, interrupted)
    assert orphans.decide_orphan(child, job, KILLED, "killed by SIGKILL", OPTIONS).fate is fate


def test_a_crash_is_a_recorded_failure_and_dead_at_the_last_attempt() -> None:
    child, job = running_child(attempt=1)
    first = orphans.decide_orphan(child, job, KILLED, "killed by SIGKILL", OPTIONS)
    assert first.outcome is not None and first.outcome.kind is SettleKind.FAILED
    child, job = running_child(attempt=2)
    last = orphans.decide_orphan(child, job, KILLED, "killed by SIGKILL", OPTIONS)
    assert last.outcome is not None and last.outcome.kind is SettleKind.DEAD
    assert "killed by SIGKILL" in (last.outcome.error or "")


def test_holdings_are_fenced_by_ticket() -> None:
    holdings = Holdings()
    ticket = Ticket("j1", HOLDER, 1)
    holdings.add(ticket, "a", 5.0)
    holdings.extend(["j1", "unknown"], 9.0)
    assert holdings.get("j1") == Held(ticket, "a", 9.0)
    assert "j1" in holdings and len(holdings) == 1
    assert holdings.drop("j1") is not None and holdings.drop("j1") is None
