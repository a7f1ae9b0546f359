"""Rate limits without a database: the option, the job's key, the in-memory buckets, the
producer that must not spin on an empty bucket, and the counter of claims cut short."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import brooq
from brooq import metrics as prom
from brooq.engine.fake import InMemoryStore
from brooq.engine.fake.buckets import Buckets
from brooq.engine.kinds import Registry
from brooq.engine.runner import SlotRunner
from brooq.engine.store import Claimed, ClaimedBatch
from brooq.supervisor.held import HeldJobs
from brooq.supervisor.leases import Holdings
from brooq.supervisor.producer import Producer
from brooq.vocabulary import (
    BUILTIN_KIND_DEFAULTS,
    InvalidJob,
    InvalidKindOptions,
    Job,
    KindOptions,
    RateLimit,
)
from tests.conftest import Clock
from tests.unit.test_supervisor_parts import count
from tests.unit.test_supervisor_services import InlineDatabase

LEASE = timedelta(minutes=1)
HOLDER = "host:1:abc"
GROUP = ("api.call",)
API = RateLimit(20, timedelta(seconds=1), 5)

# --- the option ------------------------------------------------------------------------------


def test_a_rate_limit_is_starts_per_second_minute_or_hour() -> None:
    assert KindOptions(rate_limit="20/s", rate_burst=5).rate_limit == API
    assert KindOptions(rate_limit="100/s", rate_burst=20).rate_limit == RateLimit(
        100, timedelta(seconds=1), 20
    )
    minute = KindOptions(rate_limit="30/m").rate_limit
    assert minute == RateLimit(30, timedelta(minutes=1), 30)  # burst: one interval's worth
    assert str(minute) == "30/m" and minute.per_second == 0.5
    hour = KindOptions(rate_limit="5/h").rate_limit
    assert hour is not None and (hour.count, hour.interval_us, hour.burst) == (5, 3600 * 10**6, 5)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"rate_limit": "100"}, 'like "100/s"'),
        ({"rate_limit": "100/d"}, 'like "100/s"'),
        ({"rate_limit": "1.5/s"}, 'like "100/s"'),
        ({"rate_limit": 100}, "got 100"),
        ({"rate_limit": "0/s"}, "from 1 to 1,000,000, got 0"),
        ({"rate_limit": "1000001/s"}, "from 1 to 1,000,000"),
        ({"rate_limit": "10/s", "rate_burst": 0}, "rate_burst: must be from 1"),
        ({"rate_limit": "10/s", "rate_burst": "5"}, "rate_burst: must be an integer"),
        ({"rate_limit": "10/s", "rate_burst": True}, "rate_burst: must be an integer"),
        ({"rate_burst": 5}, "rate_burst: needs a rate_limit"),
    ],
)
def test_bad_rate_limits_are_refused_at_registration(
    options: dict[str, object], problem: str
) -> None:
    queue = brooq.Queue(InMemoryStore())
    with pytest.raises(InvalidKindOptions, match="rate_") as caught:
        queue.kind("api.call", **options)
    assert problem in str(caught.value)
    assert "api.call" not in queue.registry


@pytest.mark.parametrize(
    "text",
    [" 5/s", "5/s ", "5/ s", "5 /s", " 5 / h ", "5/\ts", "\u0665/s", "\u0661\u0660/s", "\uff15/s",
     "\u00b2/s", "5/\u0455"],
)  # fmt: skip
def test_a_rate_limit_is_ascii_digits_without_spaces(text: str) -> None:
    """Issue 32, item 13: spaces anywhere and digits of other scripts (Arabic-Indic "٥",
    full-width "５") were accepted, so what the code says and what a reader sees differed."""
    with pytest.raises(InvalidKindOptions) as caught:
        KindOptions(rate_limit=text)
    assert "ASCII digits, no spaces" in str(caught.value) and repr(text) in str(caught.value)


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(InvalidKindOptions) as caught:
        KindOptions(rate_limit="fast", rate_burst=-1, max_running=0)
    text = str(caught.value)
    assert "rate_limit:" in text and "rate_burst:" in text and "max_running:" in text


def test_a_kinds_own_rate_keeps_its_own_burst_under_defaults() -> None:
    defaults = KindOptions(rate_limit="1/s", rate_burst=3).with_defaults(BUILTIN_KIND_DEFAULTS)
    own = KindOptions(rate_limit="10/s").with_defaults(defaults)
    assert own.rate_limit == RateLimit(10, timedelta(seconds=1), 10)
    inherited = KindOptions().with_defaults(defaults)
    assert inherited.rate_limit == RateLimit(1, timedelta(seconds=1), 3)


def test_the_registry_lists_the_rates_of_its_kinds() -> None:
    queue = brooq.Queue(InMemoryStore())
    queue.register("api.call", lambda c: None, rate_limit="20/s", rate_burst=5)
    queue.register("free", lambda c: None)
    assert queue.registry.rates() == {"api.call": API}


def test_a_jobs_rate_key_is_checked_like_an_idempotency_key() -> None:
    assert Job("api.call", rate_key="tenant-42").rate_key == "tenant-42"
    assert Job("api.call", rate_key="").rate_key is None  # "" is no key
    assert Job("api.call", rate_key=" ").rate_key == " "
    for bad, problem in [(42, "must be a string"), ("a\x00b", "NUL"), ("x" * 513, "above")]:
        with pytest.raises(InvalidJob, match=problem):
            Job("api.call", rate_key=bad)  # type: ignore[arg-type]


# --- the in-memory buckets -------------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_bucket_holds_burst_and_refills_at_the_rate() -> None:
    b, at = Buckets(), ("api.call", "")
    assert b.tokens(at, API, T0) == 5  # missing: full
    b.spend(at, API, 5, T0)
    assert b.tokens(at, API, T0) == 0
    assert b.wait_s(at, API, T0) == 0.05
    assert b.tokens(at, API, T0 + timedelta(milliseconds=49)) == 0
    assert b.tokens(at, API, T0 + timedelta(milliseconds=50)) == 1
    assert b.tokens(at, API, T0 + timedelta(seconds=10)) == 5  # never above the burst


def test_a_refund_gives_back_no_more_than_was_taken_and_never_overfills() -> None:
    three = RateLimit(3, timedelta(seconds=1), 3)  # 333,333.3 µs a token: rounding matters
    b, at = Buckets(), ("t", "")
    b.spend(at, three, 3, T0)
    assert b.buckets[at].full_at == T0 + timedelta(microseconds=1_000_000)
    b.refund(at, 1, T0)
    # A third of a second is 333,333.3 µs: the refund rounds down, so the token is back a
    # microsecond later than exact arithmetic would say, never earlier.
    assert b.tokens(at, three, T0) == 0
    assert b.tokens(at, three, T0 + timedelta(microseconds=1)) == 1
    b.refund(at, 5, T0)
    assert b.tokens(at, three, T0) == 3
    assert b.buckets[at].full_at <= T0
    b.refund(at, 1, T0)  # full already: stays full, no credit kept for later
    b.spend(at, three, 3, T0)
    assert b.tokens(at, three, T0) == 0


def test_a_claim_of_the_fake_never_exceeds_burst_plus_rate_times_elapsed() -> None:
    clock = Clock()
    store = InMemoryStore(clock)
    store.enqueue_many([Job("api.call", i) for i in range(200)])
    rates = {"api.call": API}
    started = clock.now
    taken: list[datetime] = []
    for _ in range(60):  # 3 s in steps of 50 ms, claiming everything each time
        taken += [clock.now] * len(store.claim_many(HOLDER, ["api.call"], LEASE, 100, None, rates))
        clock.advance(timedelta(milliseconds=50))
    assert len(taken) == 5 + 59  # 5 at once, then one per 50 ms
    for i, t in enumerate(taken):
        window = [u for u in taken[i:] if u - t <= timedelta(seconds=1)]
        assert len(window) <= 25
    assert taken[0] == started


# --- the producer ----------------------------------------------------------------------------


def rated_producer(store: InMemoryStore, db: InlineDatabase, sink: list[Claimed]) -> Producer:
    return Producer(
        store,
        db,
        HOLDER,
        LEASE,
        [GROUP],
        {},
        4,
        timedelta(seconds=1),
        max_wait=5.0,
        on_claimed=lambda c, _end: sink.extend(c),
        rates={"api.call": API},
    )


def test_a_claim_cut_short_by_the_limit_comes_back_when_the_next_token_is_due() -> None:
    """No spin (a claim every tick on an empty bucket) and no sleep until the poll interval
    (5 tokens a second would then be the whole rate): the next claim at the token."""
    clock = Clock()
    store, db, sink = InMemoryStore(clock), InlineDatabase(), list[Claimed]()
    store.enqueue_many([Job("api.call", i) for i in range(50)])
    p = rated_producer(store, db, sink)
    assert p.run_once(0.0, {GROUP: 8}, {GROUP: 8}) == 1
    assert [name for name, _, _ in db.tasks] == ["rates", "claim:api.call"]
    db.finish()
    assert len(sink) == 5  # the burst
    assert p.declared == {"api.call": API}
    state = p.groups[GROUP]
    assert not state.more_ready and state.next_poll == pytest.approx(0.05)
    assert p.next_polls(0.0) == [pytest.approx(0.05)]
    for now in (0.001, 0.01, 0.049):
        assert p.run_once(now, {GROUP: 8}, {GROUP: 8}) == 0, "claimed again before the token"
    clock.advance(timedelta(milliseconds=50))
    assert p.run_once(0.05, {GROUP: 8}, {GROUP: 8}) == 1
    db.finish()
    assert len(sink) == 6
    assert p.run_once(0.06, {GROUP: 8}, {GROUP: 8}) == 0  # declared once only


def test_a_group_of_rate_limited_topics_claims_for_its_free_workers_only() -> None:
    """No prefetch ahead of busy workers: a claimed job starts when it spends its token."""
    store, db, sink = InMemoryStore(), InlineDatabase(), list[Claimed]()
    p = rated_producer(store, db, sink)
    for i in range(200):  # the workers turn jobs over fast: 1,000 a second
        p.finished(GROUP, 10.0 + i * 0.001)
    assert p.depth(p.groups[GROUP], 8, 10.2) == 0
    mixed = ("api.call", "free")
    p.add_group(mixed)
    for i in range(200):
        p.finished(mixed, 10.0 + i * 0.001)
    assert p.depth(p.groups[mixed], 8, 10.2) > 0  # the unlimited topic keeps its buffer


def test_a_reload_that_changes_a_rate_writes_it_again() -> None:
    store, db, sink = InMemoryStore(), InlineDatabase(), list[Claimed]()
    p = rated_producer(store, db, sink)
    p.run_once(0.0, {GROUP: 0}, {GROUP: 8})
    assert [name for name, _, _ in db.tasks] == ["rates"]  # no worker free: no claim yet
    db.finish()
    slower = RateLimit(5, timedelta(seconds=1), 5)
    p.rates = {"api.call": slower}  # what a reload does (wiring.put_into_service)
    p.run_once(0.1, {GROUP: 0}, {GROUP: 8})
    assert [name for name, _, _ in db.tasks] == ["rates"]
    db.finish()
    assert p.declared == {"api.call": slower}
    assert store.buckets.buckets[("api.call", "")].rate == slower


def test_a_batch_not_cut_short_says_no_limit_waited() -> None:
    clock = Clock()
    store = InMemoryStore(clock)
    store.enqueue_many([Job("api.call", i) for i in range(10)])
    full = store.claim_many(HOLDER, ["api.call"], LEASE, 5, None, {"api.call": API})
    assert len(full) == 5 and full.rate_limited == {} and full.next_token_in() is None
    short = store.claim_many(HOLDER, ["api.call"], LEASE, 5, None, {"api.call": API})
    assert short == [] and short.rate_limited == {"api.call": 0.05}


def test_the_claims_cut_short_are_counted_per_topic() -> None:
    metrics = prom.Metrics(registry=None)
    metrics.initialise(["api.call", "free"], [])
    held = HeldJobs(
        holdings=Holdings(),
        metrics=metrics,
        writes=InlineDatabase(),
        store=InMemoryStore(),
        withdraw=lambda job_id: None,
        running=lambda job_id: None,
        interrupt=lambda child, why, note: None,
        kill=lambda child, why: None,
    )
    series = {s.labels["topic"] for f in metrics.rate_limited.collect() for s in f.samples}
    assert series == {"api.call", "free"}  # at zero from the first scrape
    assert count(metrics.rate_limited, topic="api.call") == 0
    held.claimed(ClaimedBatch([], {"api.call": 0.05}), 0.0)
    held.claimed(ClaimedBatch([], {}), 0.0)
    held.claimed([], 0.0)
    assert count(metrics.rate_limited, topic="api.call") == 1
    assert count(metrics.rate_limited, topic="free") == 0


def test_the_slot_runner_claims_within_the_rate_and_says_when_a_token_comes() -> None:
    clock = Clock()
    store = InMemoryStore(clock)
    registry = Registry()
    registry.register("api.call", lambda claim: None, KindOptions(rate_limit="2/s"))
    store.enqueue_many([Job("api.call", i) for i in range(5)])
    runner = SlotRunner(store, registry, HOLDER, LEASE)
    assert runner.run_once() is not None and runner.run_once() is not None
    assert runner.run_once() is None
    assert runner.next_token_in == 0.5
    clock.advance(timedelta(milliseconds=500))
    assert runner.run_once() is not None
    runner.close()
