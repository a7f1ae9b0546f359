"""The Store contract: one suite, run against the in-memory fake and the PostgreSQL store.

Whatever passes here holds for both, so engine tests over the fake can be
trusted. Time is the store's own: the fake's settable clock, PostgreSQL's now().
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from brooq.engine.fake import InMemoryStore
from brooq.engine.outcome import DONE, LAST_ERROR_MAX_CHARS, Outcome, SettleKind, decide
from brooq.engine.store import Claimed, ClaimedBatch, Store, Ticket, TopicCount
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import (
    BUILTIN_KIND_DEFAULTS,
    CancelJob,
    Claim,
    Delay,
    InvalidJob,
    Job,
    JobNotFound,
    KindOptions,
    PreserveAttempt,
    RateLimit,
    State,
)
from tests.conftest import Clock
from tests.integration.helpers import run_one

LEASE = timedelta(minutes=1)
LONG_LEASE = timedelta(hours=1)
OPTS = KindOptions(
    max_attempts=3, backoff_base=timedelta(seconds=10), backoff_max=timedelta(seconds=60)
).with_defaults(BUILTIN_KIND_DEFAULTS)
SLACK = timedelta(seconds=2)


def failed_outcome(attempt: int = 1) -> Outcome:
    return decide(RuntimeError("boom"), attempt, OPTS)


def dead_outcome() -> Outcome:
    return decide(RuntimeError("boom"), OPTS.max_attempts or 3, OPTS)


def canceled_outcome() -> Outcome:
    return decide(CancelJob("not wanted"), 1, OPTS)


ALL_OUTCOMES = {
    "done": DONE,
    "failed": failed_outcome(),
    "dead": dead_outcome(),
    "canceled": canceled_outcome(),
    "preserved": decide(PreserveAttempt(), 1, OPTS),
    "delayed": decide(Delay(5), 1, OPTS),
}


# -- the two stores behind one small test interface ------------------------------------------


class FakeEnv:
    """Time and row surgery for the in-memory store."""

    def __init__(self, store: InMemoryStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def now(self) -> datetime:
        return self.clock()

    def expire(self, *ids: str) -> None:
        """Move the clock past the leases of ``ids`` (longer leases survive)."""
        ends = [end for i in ids if (end := self.store.get(i).locked_until) is not None]
        latest = max(ends)
        if latest >= self.clock.now:
            self.clock.now = latest + timedelta(seconds=1)

    def force(self, job_id: str, **cols: Any) -> None:
        row = self.store.get(job_id)
        if "state" in cols:
            cols["state"] = State(cols["state"])
        self.store.rows[row.id] = dataclasses.replace(row, **cols)

    def count(self) -> int:
        return len(self.store.rows)

    def refill(self, seconds: float) -> None:
        """Let ``seconds`` pass for the rate limits' buckets (the store's clock moves)."""
        self.clock.now += timedelta(seconds=seconds)

    def buckets(self) -> set[tuple[str, str]]:
        """(topic, key) of every bucket the store keeps."""
        return set(self.store.buckets.buckets)


class PgEnv:
    """Time and row surgery for the PostgreSQL store, through a separate connection."""

    def __init__(self, store: PostgresStore, pg: psycopg.Connection[Any]) -> None:
        self.store = store
        self.pg = pg

    def now(self) -> datetime:
        row = self.pg.execute("SELECT now()").fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    def expire(self, *ids: str) -> None:
        self.pg.execute(
            "UPDATE job SET locked_until = now() - interval '1 second' WHERE id = ANY(%s::uuid[])",
            (list(ids),),
        )

    def force(self, job_id: str, **cols: Any) -> None:
        sets = pgsql.SQL(", ").join(
            pgsql.SQL("{} = {}").format(pgsql.Identifier(c), pgsql.Placeholder(c)) for c in cols
        )
        self.pg.execute(
            pgsql.SQL("UPDATE job SET {} WHERE id = {}").format(sets, pgsql.Placeholder("_id")),
            {**{c: str(v) if isinstance(v, State) else v for c, v in cols.items()}, "_id": job_id},
        )

    def count(self) -> int:
        row = self.pg.execute("SELECT count(*) FROM job").fetchone()
        assert row is not None
        return int(row[0])

    def refill(self, seconds: float) -> None:
        """Let ``seconds`` pass for the rate limits' buckets: each is moved back that long
        (the database's clock cannot be moved; its own time passes too, slowly)."""
        self.pg.execute(
            "UPDATE brooq_rate_limit SET full_at = full_at - make_interval(secs => %s)",
            (seconds,),
        )

    def buckets(self) -> set[tuple[str, str]]:
        """(topic, key) of every row of brooq_rate_limit."""
        return {(t, k) for t, k in self.pg.execute("SELECT topic, key FROM brooq_rate_limit")}


Env = FakeEnv | PgEnv


@pytest.fixture(params=["fake", "postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    """Each contract test runs once per store."""
    if request.param == "fake":
        return request.getfixturevalue("fake_store")  # type: ignore[no-any-return]
    return request.getfixturevalue("pg_store")  # type: ignore[no-any-return]


@pytest.fixture
def env(store: Store, request: pytest.FixtureRequest) -> Env:
    if isinstance(store, InMemoryStore):
        return FakeEnv(store, request.getfixturevalue("clock"))
    assert isinstance(store, PostgresStore)
    return PgEnv(store, request.getfixturevalue("pg"))


def enqueue(store: Store, topic: str = "work", payload: Any = None, **kw: Any) -> str:
    (result,) = store.enqueue_many([Job(topic=topic, payload=payload, **kw)])
    assert result.created
    return result.id


def claim(
    store: Store,
    holder: str = "worker-1",
    topics: tuple[str, ...] = ("work",),
    lease: timedelta = LEASE,
) -> Claimed:
    claimed = store.claim(holder, list(topics), lease)
    assert claimed is not None, "expected a ready job"
    return claimed


def between(value: datetime | None, low: datetime, high: datetime) -> bool:
    assert value is not None
    return low <= value <= high


# -- the happy path ---------------------------------------------------------------------------


def test_enqueue_claim_settle_done(env: Env) -> None:
    store = env.store
    job_id = enqueue(store, payload={"n": 1, "s": "é"})
    row = store.get(job_id)
    assert (row.state, row.attempts, row.locked_by, row.locked_until) == (
        State.PENDING,
        0,
        None,
        None,
    )
    assert row.payload == {"n": 1, "s": "é"} and row.topic == "work"
    assert row.idempotency_key is None and row.last_error is None

    t0 = env.now()
    claimed = claim(store, "worker-1", lease=timedelta(seconds=30))
    t1 = env.now()
    assert (claimed.id, claimed.topic) == (job_id, "work")
    assert claimed.payload == {"n": 1, "s": "é"}
    assert claimed.ticket == Ticket(job_id, "worker-1", 1) and claimed.attempt == 1
    assert between(claimed.locked_until, t0 + timedelta(seconds=30), t1 + timedelta(seconds=30))
    row = store.get(job_id)
    assert (row.state, row.attempts, row.locked_by) == (State.PROCESSING, 1, "worker-1")
    assert row.locked_until == claimed.locked_until

    assert store.settle(claimed.ticket, DONE) is True
    row = store.get(job_id)
    assert (row.state, row.attempts, row.last_error) == (State.DONE, 1, None)
    assert store.claim("worker-2", ["work"], LEASE) is None


def test_enqueue_many_returns_one_result_per_job_in_order(env: Env) -> None:
    store = env.store
    assert store.enqueue_many([]) == []
    results = store.enqueue_many([Job("work", {"i": i}) for i in range(5)])
    assert all(r.created for r in results)
    assert [store.get(r.id).payload for r in results] == [{"i": i} for i in range(5)]
    assert [r.id for r in results] == sorted(r.id for r in results)  # UUIDv7: enqueue order
    assert env.count() == 5


# -- claiming ---------------------------------------------------------------------------------


@pytest.mark.parametrize("topics", [("work",), ("work", "other")], ids=["one-topic", "topics"])
def test_claim_order_is_available_at_then_enqueue_order(env: Env, topics: tuple[str, ...]) -> None:
    """Invariant 10, through the single-topic and the multi-topic claim."""
    store = env.store
    t = env.now()
    late = enqueue(store, payload="late", available_at=t - timedelta(seconds=10))
    batch = store.enqueue_many(
        [Job("work", f"batch-{i}", available_at=t - timedelta(seconds=20)) for i in range(5)]
    )
    after_batch = enqueue(store, payload="after-batch", available_at=t - timedelta(seconds=20))
    middle = enqueue(
        store, topic=topics[-1], payload="middle", available_at=t - timedelta(seconds=15)
    )
    enqueue(store, payload="future", available_at=t + timedelta(hours=1))
    enqueue(store, topic="unserved", payload="unserved", available_at=t - timedelta(hours=1))

    expected = [r.id for r in batch] + [after_batch, middle, late]
    got = []
    while (claimed := store.claim("worker-1", list(topics), LEASE)) is not None:
        got.append(claimed.id)
        assert len(got) <= len(expected), "claimed a job that is not ready or not served"
    assert got == expected


def test_claim_order_without_available_at_is_enqueue_order(env: Env) -> None:
    store = env.store
    ids = [enqueue(store, payload=i) for i in range(6)]
    assert ids == sorted(ids)
    assert [claim(store).id for _ in ids] == ids


def test_claim_charges_an_attempt(env: Env) -> None:
    """Invariant 6: attempts = how many times the job was taken, reaper or not; the expiry is
    counted apart (invariant 7), so the attempt a handler sees is the charged one."""
    store = env.store
    job_id = enqueue(store)
    first = claim(store)
    assert first.attempt == 1 and store.get(job_id).attempts == 1
    assert store.settle(first.ticket, failed_outcome(1))
    assert store.get(job_id).attempts == 1
    env.force(job_id, available_at=env.now())

    second = claim(store)
    assert second.attempt == 2 and store.get(job_id).attempts == 2
    env.expire(job_id)
    assert store.requeue_expired().pending == [TopicCount("work", 1)]
    assert store.get(job_id).attempts == 2 and store.get(job_id).expirations == 1

    third = claim(store, "worker-2")
    assert third.ticket.attempt == 3 and store.get(job_id).attempts == 3
    assert third.attempt == 2 and store.get(job_id).charged_attempts == 2


def test_claim_returns_none_when_nothing_is_ready(env: Env) -> None:
    store = env.store
    assert store.claim("worker-1", ["work"], LEASE) is None
    enqueue(store, topic="other")
    assert store.claim("worker-1", ["work"], LEASE) is None
    assert store.claim("worker-1", ["work", "third"], LEASE) is None
    assert store.claim("worker-1", [], LEASE) is None
    enqueue(store, available_at=env.now() + timedelta(minutes=5))
    assert store.claim("worker-1", ["work"], LEASE) is None

    held = enqueue(store, topic="held")
    assert claim(store, "worker-1", ("held",)).id == held
    assert store.claim("worker-2", ["held"], LEASE) is None


def test_claim_takes_failed_rows_once_available(env: Env) -> None:
    store = env.store
    job_id = enqueue(store)
    c = claim(store)
    assert store.settle(c.ticket, decide(Delay(30), 1, OPTS))
    assert store.get(job_id).state is State.FAILED
    assert store.claim("worker-1", ["work"], LEASE) is None
    env.force(job_id, available_at=env.now() - timedelta(seconds=1))
    assert claim(store).id == job_id


# -- fencing: stale tickets write nothing -----------------------------------------------------


def _stale_ticket(env: Env, scenario: str) -> tuple[str, Ticket]:
    store = env.store
    job_id = enqueue(store)
    c = claim(store, "worker-1")
    match scenario:
        case "wrong-holder":
            return job_id, Ticket(job_id, "worker-2", c.attempt)
        case "wrong-attempt":
            return job_id, Ticket(job_id, "worker-1", c.attempt + 1)
        case "earlier-attempt":
            return job_id, Ticket(job_id, "worker-1", c.attempt - 1)
        case "after-cancel":
            assert store.cancel(job_id)
        case "after-requeue":
            env.expire(job_id)
            assert store.requeue_expired().pending == [TopicCount("work", 1)]
        case "after-requeue-and-reclaim":
            env.expire(job_id)
            store.requeue_expired()
            again = claim(store, "worker-1")  # same holder name, new attempt
            assert (again.ticket.attempt, again.attempt) == (2, 1)  # the expiry is not charged
    return job_id, c.ticket


STALE = [
    "wrong-holder",
    "wrong-attempt",
    "earlier-attempt",
    "after-cancel",
    "after-requeue",
    "after-requeue-and-reclaim",
]


@pytest.mark.parametrize("scenario", STALE)
def test_settle_with_a_stale_ticket_changes_nothing(env: Env, scenario: str) -> None:
    job_id, ticket = _stale_ticket(env, scenario)
    before = env.store.get(job_id)
    for name, outcome in ALL_OUTCOMES.items():
        assert env.store.settle(ticket, outcome) is False, name
        assert env.store.get(job_id) == before, name
    assert env.store.heartbeat([ticket], LONG_LEASE) == set()
    assert env.store.get(job_id) == before


def test_settle_of_an_unknown_job_is_false(env: Env) -> None:
    ticket = Ticket("01890000-0000-7000-8000-000000000000", "worker-1", 1)
    assert env.store.settle(ticket, DONE) is False


def test_abandon_writes_nothing(env: Env) -> None:
    store = env.store
    job_id = enqueue(store)
    c = claim(store)
    before = store.get(job_id)
    assert store.settle(c.ticket, Outcome(SettleKind.ABANDON, "abandoned")) is False
    assert store.get(job_id) == before


# -- terminal states are never overwritten (invariant 3) -------------------------------------


def _terminal(env: Env, state: str) -> tuple[str, Ticket]:
    store = env.store
    job_id = enqueue(store)
    if state == "canceled-pending":
        assert store.cancel(job_id)
        return job_id, Ticket(job_id, "worker-1", 0)
    c = claim(store)
    outcome = {"done": DONE, "dead": dead_outcome(), "canceled": canceled_outcome()}[state]
    assert store.settle(c.ticket, outcome)
    assert store.get(job_id).state == outcome.state
    return job_id, c.ticket


@pytest.mark.parametrize("state", ["done", "dead", "canceled", "canceled-pending"])
def test_terminal_rows_are_never_overwritten(env: Env, state: str) -> None:
    store = env.store
    job_id, last_ticket = _terminal(env, state)
    before = store.get(job_id)
    assert before.state.is_terminal
    for name, outcome in ALL_OUTCOMES.items():
        assert store.settle(last_ticket, outcome) is False, name
    assert store.cancel(job_id) is False
    assert store.heartbeat([last_ticket], LONG_LEASE) == set()
    assert store.claim("worker-9", ["work"], LEASE) is None
    assert store.get(job_id) == before

    # Its old lease runs out: the reaper must still leave it alone.
    env.force(job_id, locked_until=env.now() - timedelta(minutes=1))
    before = store.get(job_id)
    assert store.requeue_expired().pending == []
    assert store.get(job_id) == before


# -- heartbeat --------------------------------------------------------------------------------


def test_heartbeat_extends_only_held_tickets(env: Env) -> None:
    store = env.store
    a, b, c, d = (enqueue(store) for _ in range(4))
    held_a = claim(store, "worker-1")
    held_b = claim(store, "worker-2")
    done_c = claim(store, "worker-3")
    assert store.settle(done_c.ticket, DONE)
    lost_d = claim(store, "worker-4")
    assert store.cancel(d)
    before_c, before_d = store.get(c), store.get(d)

    tickets = [
        held_a.ticket,
        held_b.ticket,
        Ticket(b, "worker-1", 1),  # b, but not worker-1's
        done_c.ticket,
        lost_d.ticket,
        Ticket("01890000-0000-7000-8000-000000000000", "worker-1", 1),
    ]
    t0 = env.now()
    kept = store.heartbeat(tickets, timedelta(minutes=10))
    t1 = env.now()
    assert kept == {a, b}
    for job_id in (a, b):
        row = store.get(job_id)
        assert row.state is State.PROCESSING
        assert between(row.locked_until, t0 + timedelta(minutes=10), t1 + timedelta(minutes=10))
    assert store.get(c) == before_c and store.get(d) == before_d
    assert store.heartbeat([], LEASE) == set()


def test_heartbeat_keeps_the_reaper_away(env: Env) -> None:
    store = env.store
    job_id = enqueue(store)
    c = claim(store, lease=timedelta(seconds=30))
    assert store.heartbeat([c.ticket], LONG_LEASE) == {job_id}
    assert store.requeue_expired().pending == []
    assert store.get(job_id).state is State.PROCESSING
    assert store.settle(c.ticket, DONE)


# -- the reaper (invariant 7: lease expiry is not a failure) ----------------------------------


def test_requeue_expired_returns_rows_without_touching_attempts(env: Env) -> None:
    store = env.store
    expired_work = enqueue(store, "work")
    expired_other = enqueue(store, "other")
    alive = enqueue(store, "work")
    pending = enqueue(store, "work", available_at=env.now() + timedelta(hours=2))
    c1 = claim(store, "worker-1", ("work",), LEASE)
    c2 = claim(store, "worker-2", ("other",), LEASE)
    # A second attempt of expired_work: attempts must stay 2 after the reaper.
    assert store.settle(c1.ticket, failed_outcome(1))
    env.force(expired_work, available_at=env.now() - timedelta(seconds=1))
    c1 = claim(store, "worker-1", ("work",), LEASE)
    assert c1.id == expired_work and c1.attempt == 2
    c3 = claim(store, "worker-3", ("work",), LONG_LEASE)
    assert (c2.id, c3.id) == (expired_other, alive)
    before_alive, before_pending = store.get(alive), store.get(pending)

    env.expire(expired_work, expired_other)
    t0 = env.now()
    assert store.requeue_expired().pending == [TopicCount("other", 1), TopicCount("work", 1)]
    t1 = env.now()
    for job_id, attempts in ((expired_work, 2), (expired_other, 1)):
        row = store.get(job_id)
        assert (row.state, row.attempts, row.locked_by, row.locked_until) == (
            State.PENDING,
            attempts,
            None,
            None,
        )
        assert between(row.available_at, t0, t1)
    assert store.get(alive) == before_alive
    assert store.get(pending) == before_pending
    assert store.requeue_expired().pending == []
    assert store.heartbeat([c3.ticket], LEASE) == {alive}

    again = claim(store, "worker-4", ("work",))
    assert (again.id, again.ticket.attempt, again.attempt) == (expired_work, 3, 2)
    assert store.get(expired_work).expirations == 1


def test_only_expiries_in_a_row_make_a_job_dead(env: Env) -> None:
    """QUEUE_MAX_EXPIRATIONS counts expiries since the last recorded outcome."""
    store = env.store
    job_id = enqueue(store)

    def expire_once() -> None:
        claimed = claim(store)
        env.expire(claimed.id)
        store.requeue_expired(max_expirations=3)

    expire_once()
    expire_once()
    row = store.get(job_id)
    assert (row.state, row.expirations, row.expiry_streak) == (State.PENDING, 2, 2)
    recorded = claim(store)  # a run whose outcome is written ends the streak
    assert store.settle(recorded.ticket, failed_outcome(recorded.attempt))
    env.force(job_id, available_at=env.now() - timedelta(seconds=1))
    row = store.get(job_id)
    assert (row.state, row.expirations, row.expiry_streak) == (State.FAILED, 2, 0)
    expire_once()
    expire_once()
    assert store.get(job_id).state is State.PENDING  # 4 expiries, 2 in a row
    last = claim(store)
    env.expire(last.id)
    assert store.requeue_expired(max_expirations=3).dead == [TopicCount("work", 1)]
    row = store.get(job_id)
    assert (row.state, row.attempts, row.expirations, row.expiry_streak) == (State.DEAD, 6, 5, 3)
    assert row.last_error == (
        "lease expired 3 times in a row: its holder died every time it ran "
        "(last holder worker-1); the job may be killing its host"
    )


# -- retention --------------------------------------------------------------------------------


def test_delete_terminal_honours_ttl_batch_and_order(env: Env) -> None:
    store = env.store
    now = env.now()
    aged: dict[str, str] = {}

    def make(topic: str, state: str, age: timedelta) -> str:
        job_id = enqueue(store, topic)
        if state in ("processing", "failed", "done", "dead", "canceled-running"):
            c = claim(store, topics=(topic,), lease=LONG_LEASE)
            if state == "failed":
                assert store.settle(c.ticket, failed_outcome(1))
            elif state == "done":
                assert store.settle(c.ticket, DONE)
            elif state == "dead":
                assert store.settle(c.ticket, dead_outcome())
            elif state == "canceled-running":
                assert store.cancel(job_id)
        elif state == "canceled":
            assert store.cancel(job_id)
        env.force(job_id, updated_at=now - age)
        aged[job_id] = state
        return job_id

    day = timedelta(days=1)
    oldest = make("a", "canceled", 6 * day)
    second = make("b", "done", 5 * day)
    third = make("a", "dead", 4 * day)
    fourth = make("a", "done", 3 * day)
    fifth = make("b", "canceled-running", 2 * day)
    recent = make("a", "done", timedelta(hours=1))
    keep = [make("a", s, 30 * day) for s in ("pending", "processing", "failed")]

    assert store.delete_terminal(day, 2) == [TopicCount("a", 1), TopicCount("b", 1)]
    assert _exists(store, oldest, second) == [False, False]
    assert _exists(store, third, fourth, fifth) == [True, True, True]
    assert store.delete_terminal(day, 2) == [TopicCount("a", 2)]
    assert _exists(store, third, fourth) == [False, False]
    assert store.delete_terminal(day, 2) == [TopicCount("b", 1)]
    assert store.delete_terminal(day, 2) == []
    assert _exists(store, fifth, recent, *keep) == [False, True, True, True, True]
    assert env.count() == 4

    assert store.delete_terminal(timedelta(minutes=30), 10) == [TopicCount("a", 1)]
    assert _exists(store, recent, *keep) == [False, True, True, True]


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-1)])
def test_delete_terminal_refuses_a_ttl_that_would_delete_everything(
    env: Env, ttl: timedelta
) -> None:
    """0 disables retention at the config level; the store never reads it as "delete all"."""
    store = env.store
    job_id = enqueue(store)
    assert store.settle(claim(store).ticket, DONE)
    env.force(job_id, updated_at=env.now() - timedelta(days=365))
    with pytest.raises(ValueError, match="TTL"):
        store.delete_terminal(ttl, 100)
    assert env.count() == 1


def _exists(store: Store, *ids: str) -> list[bool]:
    out = []
    for job_id in ids:
        try:
            store.get(job_id)
        except JobNotFound:
            out.append(False)
        else:
            out.append(True)
    return out


# -- cancel and get ---------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "failed", "processing"])
def test_cancel_a_live_job(env: Env, state: str) -> None:
    store = env.store
    job_id = enqueue(store)
    if state != "pending":
        c = claim(store)
        if state == "failed":
            assert store.settle(c.ticket, failed_outcome(1))
    assert store.get(job_id).state == state
    attempts = store.get(job_id).attempts
    assert store.cancel(job_id, reason="operator said so") is True
    row = store.get(job_id)
    assert row.state is State.CANCELED and row.attempts == attempts
    assert row.last_error is not None and "operator said so" in row.last_error
    assert store.claim("worker-1", ["work"], LEASE) is None
    assert store.cancel(job_id) is False


def test_cancel_without_reason_keeps_last_error(env: Env) -> None:
    store = env.store
    job_id = enqueue(store)
    assert store.settle(claim(store).ticket, failed_outcome(1))
    error = store.get(job_id).last_error
    assert error == "RuntimeError: boom"
    assert store.cancel(job_id) is True
    assert store.get(job_id).last_error == error


@pytest.mark.parametrize("state", ["done", "dead", "canceled"])
def test_cancel_a_terminal_job_is_false(env: Env, state: str) -> None:
    job_id, _ = _terminal(env, state)
    before = env.store.get(job_id)
    assert env.store.cancel(job_id, reason="too late") is False
    assert env.store.get(job_id) == before


@pytest.mark.parametrize(
    "job_id", ["01890000-0000-7000-8000-000000000000", "not-a-uuid", "", "' OR 1=1 --"]
)
def test_unknown_ids_raise_job_not_found(env: Env, job_id: str) -> None:
    enqueue(env.store)
    with pytest.raises(JobNotFound):
        env.store.get(job_id)
    with pytest.raises(JobNotFound):
        env.store.cancel(job_id)
    assert env.count() == 1


def test_get_accepts_any_spelling_of_the_id(env: Env) -> None:
    job_id = enqueue(env.store)
    assert env.store.get(job_id.upper()).id == job_id
    assert env.store.get(f" {job_id} ").id == job_id


# -- outcomes and signals, through the real SlotRunner ----------------------------------------


def _run(env: Env, handler: Any, **options: Any) -> tuple[Any, datetime, datetime]:
    options = {
        "max_attempts": 3,
        "backoff_base": timedelta(seconds=10),
        "backoff_max": timedelta(seconds=60),
        **options,
    }
    t0 = env.now()
    attempted = run_one(env.store, handler, **options)
    t1 = env.now()
    assert attempted is not None
    return attempted, t0, t1


def _ready(env: Env, job_id: str) -> None:
    env.force(job_id, available_at=env.now() - timedelta(milliseconds=1))


def test_handler_success_is_done(env: Env) -> None:
    job_id = enqueue(env.store, payload={"x": 1})
    available_at = env.store.get(job_id).available_at
    seen: list[Claim] = []
    attempted, _, _ = _run(env, seen.append)
    assert attempted.written and attempted.outcome.label == "done"
    assert [c.id for c in seen] == [job_id] and seen[0].payload == {"x": 1}
    assert seen[0].attempt == 1 and seen[0].lease.holder == "worker-1"
    row = env.store.get(job_id)
    assert (row.state, row.attempts, row.last_error) == (State.DONE, 1, None)
    assert row.available_at == available_at


def test_handler_error_fails_with_backoff_then_dies_on_the_last_attempt(env: Env) -> None:
    job_id = enqueue(env.store)

    def handler(claim: Claim) -> None:
        raise ValueError(f"bad input on attempt {claim.attempt}")

    for attempt, ceiling in ((1, 10), (2, 20)):
        attempted, t0, t1 = _run(env, handler)
        assert attempted.written and attempted.outcome.label == "failed"
        row = env.store.get(job_id)
        assert (row.state, row.attempts) == (State.FAILED, attempt)
        assert row.last_error == f"ValueError: bad input on attempt {attempt}"
        d = timedelta(seconds=ceiling)
        assert between(row.available_at, t0 + d / 2, t1 + d), (row.available_at, t0, t1)
        assert row.locked_by == "worker-1"  # the last holder stays, for diagnosis
        _ready(env, job_id)

    attempted, _, _ = _run(env, handler)
    assert attempted.outcome.label == "dead"
    row = env.store.get(job_id)
    assert (row.state, row.attempts) == (State.DEAD, 3)
    assert row.last_error == "ValueError: bad input on attempt 3"
    assert env.store.claim("worker-1", ["work"], LEASE) is None


def test_backoff_is_capped_by_backoff_max(env: Env) -> None:
    job_id = enqueue(env.store)
    env.force(job_id, attempts=9)  # the claim makes it attempt 10: 10s * 2**9 > 60s

    def handler(claim: Claim) -> None:
        raise RuntimeError("again")

    _, t0, t1 = _run(env, handler, max_attempts=20)
    row = env.store.get(job_id)
    assert (row.state, row.attempts) == (State.FAILED, 10)
    assert between(row.available_at, t0 + timedelta(seconds=30), t1 + timedelta(seconds=60))


def test_single_attempt_kind_dies_at_once(env: Env) -> None:
    job_id = enqueue(env.store)

    def handler(claim: Claim) -> None:
        raise KeyError("missing")

    available_at = env.store.get(job_id).available_at
    attempted, _, _ = _run(env, handler, max_attempts=1)
    assert attempted.outcome.label == "dead"
    row = env.store.get(job_id)
    assert (row.state, row.attempts, row.last_error) == (State.DEAD, 1, "KeyError: 'missing'")
    assert row.available_at == available_at


@pytest.mark.parametrize("chained", [False, True], ids=["direct", "from-cause"])
def test_cancel_job_signal_cancels_whatever_attempts_remain(env: Env, chained: bool) -> None:
    job_id = enqueue(env.store)

    def handler(claim: Claim) -> None:
        raise CancelJob("customer gone")

    def wrapped_handler(claim: Claim) -> None:
        try:
            raise LookupError("no customer")
        except LookupError as err:
            raise CancelJob("customer gone") from err

    available_at = env.store.get(job_id).available_at
    attempted, _, _ = _run(env, wrapped_handler if chained else handler, max_attempts=5)
    assert attempted.outcome.label == "canceled"
    row = env.store.get(job_id)
    assert (row.state, row.attempts, row.available_at) == (State.CANCELED, 1, available_at)
    assert row.last_error is not None and "CancelJob" in row.last_error
    assert "customer gone" in row.last_error


def test_signal_found_through_the_cause_chain(env: Env) -> None:
    job_id = enqueue(env.store)

    def handler(claim: Claim) -> None:
        try:
            raise CancelJob("gone")
        except CancelJob as signal:
            raise RuntimeError("while handling") from signal

    attempted, _, _ = _run(env, handler)
    assert attempted.outcome.label == "canceled"
    assert env.store.get(job_id).state is State.CANCELED


def test_delay_retries_later_without_charging_more(env: Env) -> None:
    job_id = enqueue(env.store)

    def handler(claim: Claim) -> None:
        raise Delay(30)

    attempted, t0, t1 = _run(env, handler)
    assert attempted.outcome.label == "delayed"
    row = env.store.get(job_id)
    assert (row.state, row.attempts) == (State.FAILED, 1)
    assert between(row.available_at, t0 + timedelta(seconds=30), t1 + timedelta(seconds=30))
    assert row.last_error is not None and "Delay" in row.last_error


def test_delay_is_clamped_to_backoff_max(env: Env) -> None:
    job_id = enqueue(env.store)

    def handler(claim: Claim) -> None:
        raise Delay(timedelta(hours=5))

    _, t0, t1 = _run(env, handler, backoff_max=timedelta(seconds=60))
    row = env.store.get(job_id)
    assert (row.state, row.attempts) == (State.FAILED, 1)
    assert between(row.available_at, t0 + timedelta(seconds=60), t1 + timedelta(seconds=60))


def test_delay_on_the_last_attempt_is_dead(env: Env) -> None:
    job_id = enqueue(env.store)

    def handler(claim: Claim) -> None:
        raise Delay(1)

    for attempt in (1, 2):
        _run(env, handler)
        assert env.store.get(job_id).state is State.FAILED
        assert env.store.get(job_id).attempts == attempt
        _ready(env, job_id)
    attempted, _, _ = _run(env, handler)
    assert attempted.outcome.label == "dead"
    row = env.store.get(job_id)
    assert (row.state, row.attempts) == (State.DEAD, 3)


def test_preserve_attempt_refunds_the_attempt_and_never_dies(env: Env) -> None:
    job_id = enqueue(env.store)
    attempts_seen: list[int] = []

    def handler(claim: Claim) -> None:
        attempts_seen.append(claim.attempt)
        raise PreserveAttempt("upstream is down")

    for _ in range(4):
        attempted, t0, t1 = _run(env, handler, max_attempts=1)
        assert attempted.outcome.label == "preserved"
        row = env.store.get(job_id)
        assert (row.state, row.attempts) == (State.FAILED, 0)
        assert between(row.available_at, t0 + timedelta(seconds=5), t1 + timedelta(seconds=10))
        assert row.last_error is not None and "upstream is down" in row.last_error
        _ready(env, job_id)
    assert attempts_seen == [1, 1, 1, 1]


def test_preserve_attempt_never_goes_below_zero(env: Env) -> None:
    store = env.store
    job_id = enqueue(store)
    c = claim(store)
    env.force(job_id, attempts=0)  # as if a refund had already happened
    ticket = Ticket(job_id, c.ticket.holder, 0)
    assert store.settle(ticket, decide(PreserveAttempt(), 1, OPTS))
    row = store.get(job_id)
    assert (row.state, row.attempts) == (State.FAILED, 0)


def test_last_error_is_bounded_and_storable(env: Env) -> None:
    """A NUL (which PostgreSQL text refuses) and a huge message still settle the failure."""
    job_id = enqueue(env.store)

    def handler(claim: Claim) -> None:
        raise ValueError("nul \x00 inside " + "x" * 10_000)

    attempted, _, _ = _run(env, handler)
    assert attempted.written and attempted.outcome.label == "failed"
    row = env.store.get(job_id)
    assert row.state is State.FAILED and row.last_error is not None
    assert row.last_error.startswith("ValueError: nul \\0 inside xxx")
    assert len(row.last_error) <= LAST_ERROR_MAX_CHARS


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt()], ids=repr)
def test_base_exceptions_from_a_handler_are_recorded_failures(
    env: Env, error: BaseException
) -> None:
    job_id = enqueue(env.store)

    def handler(claim: Claim) -> None:
        raise error

    attempted, _, _ = _run(env, handler)
    assert attempted.written and attempted.outcome.label == "failed"
    row = env.store.get(job_id)
    assert row.state is State.FAILED and row.last_error is not None
    assert type(error).__name__ in row.last_error


def test_run_once_with_nothing_ready_is_none(env: Env) -> None:
    assert run_one(env.store, lambda claim: None) is None


# -- idempotency (invariant 8) ----------------------------------------------------------------


def test_same_key_same_topic_is_the_same_job(env: Env) -> None:
    store = env.store
    (first,) = store.enqueue_many([Job("work", {"v": 1}, idempotency_key="order-42")])
    (again,) = store.enqueue_many([Job("work", {"v": 2}, idempotency_key="order-42")])
    assert first.created and not again.created and again.id == first.id
    assert store.get(first.id).payload == {"v": 1}
    assert store.get(first.id).idempotency_key == "order-42"
    assert env.count() == 1


@pytest.mark.parametrize("state", ["done", "dead", "canceled", "canceled-pending"])
def test_key_holds_for_the_life_of_the_row(env: Env, state: str) -> None:
    store = env.store
    (first,) = store.enqueue_many([Job("work", idempotency_key="k")])
    c = claim(store) if state != "canceled-pending" else None
    if state == "done":
        assert c is not None and store.settle(c.ticket, DONE)
    elif state == "dead":
        assert c is not None and store.settle(c.ticket, dead_outcome())
    else:
        assert store.cancel(first.id)
    before = store.get(first.id)
    (again,) = store.enqueue_many([Job("work", idempotency_key="k")])
    assert again == (first.id, False)
    assert store.get(first.id) == before
    assert env.count() == 1


def test_same_key_other_topic_is_a_new_job(env: Env) -> None:
    store = env.store
    (a,) = store.enqueue_many([Job("work", idempotency_key="k")])
    (b,) = store.enqueue_many([Job("other", idempotency_key="k")])
    assert a.created and b.created and a.id != b.id
    assert env.count() == 2


@pytest.mark.parametrize("key", ["", None])
def test_empty_key_is_no_key(env: Env, key: str | None) -> None:
    store = env.store
    results = store.enqueue_many([Job("work", idempotency_key=key)])
    results += store.enqueue_many([Job("work", idempotency_key=key)])
    assert [r.created for r in results] == [True, True]
    assert results[0].id != results[1].id
    assert store.get(results[0].id).idempotency_key is None
    assert env.count() == 2


def test_blank_key_is_a_real_key(env: Env) -> None:
    store = env.store
    (a,) = store.enqueue_many([Job("work", idempotency_key=" ")])
    (b,) = store.enqueue_many([Job("work", idempotency_key=" ")])
    (c,) = store.enqueue_many([Job("work", idempotency_key="  ")])
    (d,) = store.enqueue_many([Job("work", idempotency_key="")])
    assert a.created and b == (a.id, False)
    assert c.created and d.created and len({a.id, c.id, d.id}) == 3
    assert store.get(a.id).idempotency_key == " "
    assert env.count() == 3


def test_duplicates_inside_one_batch(env: Env) -> None:
    store = env.store
    (existing,) = store.enqueue_many([Job("work", "old", idempotency_key="k0")])
    results = store.enqueue_many(
        [
            Job("work", 1, idempotency_key="k1"),
            Job("work", 2, idempotency_key="k1"),
            Job("work", 3, idempotency_key="k2"),
            Job("other", 4, idempotency_key="k1"),
            Job("work", 5, idempotency_key=""),
            Job("work", 6, idempotency_key=""),
            Job("work", 7, idempotency_key="k0"),
            Job("work", 8, idempotency_key="k1"),
        ]
    )
    created = [r.created for r in results]
    assert created == [True, False, True, True, True, True, False, False]
    ids = [r.id for r in results]
    assert ids[1] == ids[0] and ids[7] == ids[0] and ids[6] == existing.id
    assert len({ids[0], ids[2], ids[3], ids[4], ids[5], existing.id}) == 6
    assert store.get(ids[0]).payload == 1
    assert env.count() == 6


@pytest.mark.parametrize("reason", ["bad \udcff", "nul \x00 inside"])
def test_a_cancel_reason_postgresql_cannot_store_is_refused(env: Env, reason: str) -> None:
    store = env.store
    job_id = enqueue(store)
    with pytest.raises(InvalidJob):
        store.cancel(job_id, reason)
    assert store.get(job_id).state is State.PENDING


# -- rate limits (kind option rate_limit, Job.rate_key) ---------------------------------------
# Rates of a few a minute: the time a test takes (the database's clock keeps running) never
# adds a token; time is let pass with env.refill.

SIX_A_MINUTE = RateLimit(6, timedelta(minutes=1), 3)
"""A token every 10 s, 3 at once."""
RATES = {"api": SIX_A_MINUTE}


def rated(env: Env, limit: int = 100, holder: str = "worker-1", **kw: Any) -> ClaimedBatch:
    return env.store.claim_many(holder, ["api"], LEASE, limit, kw.pop("limits", None), RATES)


def test_a_rate_limit_lets_the_burst_through_then_one_token_per_interval(env: Env) -> None:
    ids = [enqueue(env.store, "api", i) for i in range(10)]
    first = rated(env)
    assert [c.id for c in first] == ids[:3]  # the burst, in claim order
    assert set(first.rate_limited) == {"api"} and 9 < first.rate_limited["api"] <= 10
    empty = rated(env, holder="worker-2")  # another claimer: the same bucket
    assert empty == [] and 9 < empty.rate_limited["api"] <= 10
    env.refill(10)
    assert [c.id for c in rated(env)] == ids[3:4]
    env.refill(25)
    assert [c.id for c in rated(env)] == ids[4:6]  # 2.5 tokens: two whole ones
    env.refill(3600)
    assert [c.id for c in rated(env)] == ids[6:9]  # never more than the burst
    assert env.store.claim_many("w", ["api"], LEASE, 100) != [], "no rates: no limit"


def test_a_claim_not_cut_short_by_the_limit_reports_none(env: Env) -> None:
    for i in range(5):
        enqueue(env.store, "api", i)
    assert rated(env, limit=2).rate_limited == {}
    one = rated(env, limit=2)
    assert len(one) == 1 and set(one.rate_limited) == {"api"}  # 3rd token: then short
    assert rated(env, limit=1).rate_limited.keys() == {"api"}
    enqueue(env.store, "other")
    both = env.store.claim_many("w", ["api", "other"], LEASE, 5, None, RATES)
    assert [c.topic for c in both] == ["other"] and set(both.rate_limited) == {"api"}


def test_a_released_job_gives_its_token_back(env: Env) -> None:
    ids = [enqueue(env.store, "api", i) for i in range(6)]
    claimed = rated(env)
    assert len(claimed) == 3 and rated(env) == []
    assert env.store.release([claimed[0].ticket, claimed[1].ticket]) == set(ids[:2])
    assert len(rated(env)) == 2  # the two tokens back, nothing more
    assert rated(env) == []


def test_release_unknown_gives_tokens_back_the_reaper_does_not(env: Env) -> None:
    hourly = {"api": RateLimit(3, timedelta(hours=1), 3)}  # env.expire lets a minute pass

    def take(holder: str) -> ClaimedBatch:
        return env.store.claim_many(holder, ["api"], LEASE, 100, None, hourly)

    for i in range(8):
        enqueue(env.store, "api", i)
    claimed = take("lost")
    assert len(claimed) == 3
    assert len(env.store.release_unknown("lost", [claimed[0].id])) == 2
    others = take("other")
    assert len(others) == 2
    env.expire(claimed[0].id, *(c.id for c in others))  # their holders died: no release
    assert env.store.requeue_expired().pending == [TopicCount("api", 3)]
    assert take("next") == []


def test_a_refund_never_fills_a_bucket_above_its_burst(env: Env) -> None:
    for i in range(6):
        enqueue(env.store, "api", i)
    claimed = rated(env)
    env.refill(3600)  # full again while the jobs were held
    env.store.release([c.ticket for c in claimed])
    assert len(rated(env)) == 3


def test_each_rate_key_has_its_own_bucket_and_a_busy_key_never_starves_the_others(
    env: Env,
) -> None:
    busy = [enqueue(env.store, "api", i, rate_key="busy") for i in range(20)]
    quiet = enqueue(env.store, "api", "q", rate_key="quiet")
    plain = [enqueue(env.store, "api", i) for i in range(2)]
    got = rated(env)
    assert [c.id for c in got] == [*busy[:3], quiet, *plain]  # claim order across keys
    assert {env.store.get(c.id).rate_key for c in got} == {"busy", "quiet", None}
    late = enqueue(env.store, "api", "late", rate_key="late")
    assert [c.id for c in rated(env)] == [late]  # busy is empty; a new key is full


def test_keys_are_served_in_priority_order_among_those_with_tokens(env: Env) -> None:
    low = [enqueue(env.store, "api", i, rate_key="a", priority=0) for i in range(3)]
    high = [enqueue(env.store, "api", i, rate_key="b", priority=5) for i in range(4)]
    assert [c.id for c in rated(env, limit=4)] == high[:3] + low[:1]
    assert [c.id for c in rated(env, limit=4)] == low[1:]


def test_idle_key_buckets_are_removed_and_the_topics_stays(env: Env) -> None:
    enqueue(env.store, "api", 1, rate_key="k1")
    enqueue(env.store, "api", 2, rate_key="k2")
    assert len(rated(env)) == 2
    assert env.buckets() == {("api", ""), ("api", "k1"), ("api", "k2")}
    env.refill(5)  # each key spent one token (10 s): half way back to full
    rated(env)
    assert env.buckets() == {("api", ""), ("api", "k1"), ("api", "k2")}
    env.refill(3600)
    rated(env)
    assert env.buckets() == {("api", "")}


def test_max_running_and_a_rate_limit_combine(env: Env) -> None:
    for i in range(6):
        enqueue(env.store, "api", i)
    two = rated(env, limits={"api": 2})
    assert len(two) == 2  # max_running first
    assert env.store.settle(two[0].ticket, DONE)
    assert len(rated(env, limits={"api": 2})) == 1  # room for one, and one token left
    assert env.store.settle(two[1].ticket, DONE)
    assert rated(env, limits={"api": 2}) == []  # room, but no token


def test_declared_rates_make_a_full_bucket_and_keep_its_tokens(env: Env) -> None:
    env.store.declare_rates(RATES)
    assert env.buckets() == {("api", "")}
    for i in range(5):
        enqueue(env.store, "api", i)
    assert len(rated(env)) == 3
    env.store.declare_rates({"api": RateLimit(6, timedelta(minutes=1), 4)})
    assert rated(env) == []  # a new burst adds no token


# -- a job's own options and trace context ----------------------------------------------------

OVERRIDES: dict[str, Any] = {
    "max_attempts": 7,
    "attempt_timeout": timedelta(microseconds=1),
    "max_execution_timeout": timedelta(days=365),
    "backoff_base": timedelta(seconds=2, microseconds=5),
    "backoff_max": timedelta(minutes=3),
}
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "t": "é"}


@pytest.mark.parametrize("how", ["one", "many", "keyed", "after"])
def test_a_jobs_overrides_and_trace_context_are_stored_and_claimed(env: Env, how: str) -> None:
    """Every enqueue path (one job, a batch, a keyed job, a job with parents) stores them
    exactly, and the claim hands them over; a job without them has none."""
    store = env.store
    extra: dict[str, Any] = {}
    if how == "keyed":
        extra["idempotency_key"] = "k"
    if how == "after":
        parent = enqueue(store, topic="parent")
        assert store.settle(claim(store, topics=("parent",)).ticket, DONE)
        extra["after"] = [parent]
    job = Job("work", 1, trace_context=TRACE, **OVERRIDES, **extra)
    jobs = [job] if how in ("one", "keyed") else [job, Job("work", 2)]
    ids = [r.id for r in store.enqueue_many(jobs)]

    row = store.get(ids[0])
    assert {name: getattr(row, name) for name in OVERRIDES} == OVERRIDES
    assert row.overrides == KindOptions(**OVERRIDES) and row.trace_context == TRACE
    claimed = {c.id: c for c in store.claim_many("worker-1", ["work"], LEASE, 10)}
    assert claimed[ids[0]].overrides == KindOptions(**OVERRIDES)
    assert json.loads(claimed[ids[0]].trace_context or "null") == TRACE
    for plain in ids[1:]:
        assert store.get(plain).overrides is None and store.get(plain).trace_context is None
        assert (claimed[plain].overrides, claimed[plain].trace_context) == (None, None)


def test_a_job_may_override_some_options_and_keep_the_others(env: Env) -> None:
    job_id = enqueue(env.store, max_attempts=2)
    assert env.store.get(job_id).overrides == KindOptions(max_attempts=2)
    assert claim(env.store).overrides == KindOptions(max_attempts=2)
    options = OPTS.overridden_by(KindOptions(max_attempts=2))
    assert options == dataclasses.replace(OPTS, max_attempts=2)


def _failing(claim: Claim) -> None:
    raise ValueError(f"failed attempt {claim.attempt}")


def test_a_jobs_max_attempts_overrides_its_kinds(env: Env) -> None:
    """max_attempts 1 on the job: dead after one failure where the kind allows 5; and the
    other way round, 3 on the job where the kind allows 1: failed, retried."""
    once = enqueue(env.store, max_attempts=1)
    attempted, _, _ = _run(env, _failing, max_attempts=5)
    assert attempted.claimed.id == once and attempted.outcome.label == "dead"
    assert (env.store.get(once).state, env.store.get(once).attempts) == (State.DEAD, 1)

    more = enqueue(env.store, max_attempts=3)
    seen: list[Claim] = []

    def handler(claim: Claim) -> None:
        seen.append(claim)
        _failing(claim)

    attempted, _, _ = _run(env, handler, max_attempts=1)
    assert attempted.claimed.id == more and attempted.outcome.label == "failed"
    assert seen[0].max_attempts == 3 and not seen[0].is_last_attempt
    _ready(env, more)
    _run(env, handler, max_attempts=1)
    _ready(env, more)
    attempted, _, _ = _run(env, handler, max_attempts=1)
    assert attempted.outcome.label == "dead" and seen[-1].is_last_attempt
    assert env.store.get(more).attempts == 3


def test_a_jobs_backoff_overrides_its_kinds(env: Env) -> None:
    """The retry of a job with its own backoff_base and backoff_max follows them (the kind
    says 10 s, capped at 60 s; the job 100 s, capped at 100 s)."""
    job_id = enqueue(env.store, backoff_base="100s", backoff_max="100s")
    _, t0, t1 = _run(env, _failing)
    row = env.store.get(job_id)
    d = timedelta(seconds=100)
    assert row.state == State.FAILED
    assert between(row.available_at, t0 + d / 2, t1 + d), (row.available_at, t0, t1)

    capped = enqueue(env.store, backoff_max="1s")  # below the kind's base: the cap holds
    _, t0, t1 = _run(env, _failing)
    assert between(env.store.get(capped).available_at, t0, t1 + timedelta(seconds=1))


def test_a_jobs_attempt_timeout_sets_its_deadline(env: Env) -> None:
    enqueue(env.store, attempt_timeout="2h")
    seen: list[Claim] = []
    before = datetime.now(UTC)  # a deadline is on the worker's clock
    _run(env, seen.append, attempt_timeout="1m")
    after = datetime.now(UTC)
    assert between(seen[0].deadline, before + timedelta(hours=2), after + timedelta(hours=2))
