"""Fair claiming across keys (issue 34), one contract for the in-memory and the PostgreSQL
store: within a topic and a priority the keys (rate_key) take turns, weighted, work-
conserving, composed with max_running, rate limits and priorities."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from brooq.engine.store import Store
from brooq.vocabulary import Fairness, InvalidKindOptions, Job, KindOptions, RateLimit
from tests.integration.test_contract import LEASE, Env, FakeEnv, PgEnv

FAIR = {"work": Fairness()}


@pytest.fixture(params=["fake", "postgres"])
def env(request: pytest.FixtureRequest) -> Env:
    """Each test runs once per store."""
    if request.param == "fake":
        return FakeEnv(request.getfixturevalue("fake_store"), request.getfixturevalue("clock"))
    return PgEnv(request.getfixturevalue("pg_store"), request.getfixturevalue("pg"))


def jobs(store: Store, key: str | None, n: int, priority: int = 0) -> list[str]:
    """``n`` jobs of ``key``, in order; their ids."""
    made = store.enqueue_many(
        [Job("work", {"i": i}, rate_key=key, priority=priority) for i in range(n)]
    )
    return [e.id for e in made]


def claim(store: Store, n: int, fair: Any = FAIR, **kw: Any) -> set[str]:
    return {c.id for c in store.claim_many("w", ["work"], LEASE, n, fair=fair, **kw)}


def test_keys_take_turns_and_a_late_key_does_not_wait_behind_a_busy_one(env: Env) -> None:
    a = jobs(env.store, "a", 6)
    b = jobs(env.store, "b", 2)
    assert claim(env.store, 4) == {a[0], b[0], a[1], b[1]}
    assert claim(env.store, 4) == set(a[2:6])


def one_by_one(store: Store, n: int) -> list[str]:
    """``n`` claims of one job each (``brooq work``, ``queue.drain()``); the ids in order."""
    return [c.id for _ in range(n) for c in store.claim_many("w", ["work"], LEASE, 1, fair=FAIR)]


def test_keys_alternate_over_claims_of_one_job_each(env: Env) -> None:
    a = jobs(env.store, "a", 4)
    b = jobs(env.store, "b", 2)
    assert one_by_one(env.store, 6) == [a[0], b[0], a[1], b[1], a[2], a[3]]


def test_a_key_back_after_a_pause_takes_turns_at_once_with_no_credit(env: Env) -> None:
    a = jobs(env.store, "a", 20)
    b = jobs(env.store, "b", 1)
    assert one_by_one(env.store, 2) == [a[0], b[0]]
    assert one_by_one(env.store, 10) == a[1:11]  # a alone gets everything
    b_again = jobs(env.store, "b", 5)
    taken = one_by_one(env.store, 6)
    assert [i in b_again for i in taken] == [True, False, True, False, True, False], taken


def test_a_new_key_is_served_next_however_long_the_others_ran(env: Env) -> None:
    a = jobs(env.store, "a", 30)
    assert one_by_one(env.store, 25) == a[:25]
    c = jobs(env.store, "c", 2)
    assert one_by_one(env.store, 4) == [c[0], a[25], c[1], a[26]]


def test_without_fairness_the_same_jobs_are_claimed_in_enqueue_order(env: Env) -> None:
    a = jobs(env.store, "a", 6)
    jobs(env.store, "b", 2)
    assert claim(env.store, 4, fair=None) == set(a[:4])


def test_a_key_alone_gets_everything(env: Env) -> None:
    a = jobs(env.store, "a", 5)
    assert claim(env.store, 10) == set(a)


def test_a_weighted_key_takes_its_weight_per_turn(env: Env) -> None:
    a = jobs(env.store, "a", 6)
    b = jobs(env.store, "b", 6)
    c = jobs(env.store, "c", 6)
    fair = {"work": KindOptions(fairness="round_robin", fair_weights={"a": 2}).fairness}
    assert claim(env.store, 8, fair=fair) == {*a[:4], *b[:2], *c[:2]}


def test_priorities_come_first_then_the_keys_take_turns(env: Env) -> None:
    a_low = jobs(env.store, "a", 3)
    b_low = jobs(env.store, "b", 3)
    a_high = jobs(env.store, "a", 2, priority=5)
    # a's two priority-5 jobs go first; then a and b take turns at priority 0.
    assert one_by_one(env.store, 6) == [*a_high, b_low[0], a_low[0], b_low[1], a_low[1]]


def test_jobs_without_a_key_share_one_turn(env: Env) -> None:
    a = jobs(env.store, "a", 4)
    none = jobs(env.store, None, 4)
    b = jobs(env.store, "b", 1)
    assert claim(env.store, 5) == {a[0], none[0], b[0], a[1], none[1]}


def test_fairness_composes_with_max_running(env: Env) -> None:
    a = jobs(env.store, "a", 6)
    b = jobs(env.store, "b", 2)
    assert claim(env.store, 10, limits={"work": 3}) == {a[0], b[0], a[1]}
    assert claim(env.store, 10, limits={"work": 3}) == set()  # three are running


def test_fairness_composes_with_a_rate_limit(env: Env) -> None:
    a = jobs(env.store, "a", 6)
    b = jobs(env.store, "b", 2)
    rates = {"work": RateLimit(100, timedelta(seconds=1), 100)}
    assert claim(env.store, 4, rates=rates) == {a[0], b[0], a[1], b[1]}
    c = jobs(env.store, "c", 3)
    # One at a time, the keys with tokens still alternate: c is new, a's turn comes next.
    taken = [
        x.id
        for _ in range(3)
        for x in env.store.claim_many("w", ["work"], LEASE, 1, {}, rates, FAIR)
    ]
    assert taken == [c[0], a[2], c[1]]


def test_a_key_without_tokens_waits_and_the_others_go_on_in_turn(env: Env) -> None:
    a = jobs(env.store, "a", 6)
    b = jobs(env.store, "b", 6)
    rates = {"work": RateLimit(2, timedelta(hours=1), 2)}  # two starts per key, then none
    assert claim(env.store, 10, rates=rates) == {a[0], a[1], b[0], b[1]}
    assert claim(env.store, 10, rates=rates) == set()


def test_a_fair_claim_takes_only_its_version(env: Env) -> None:
    store = env.store
    store.app_version = "v2"
    v2 = jobs(store, "a", 2)
    store.app_version = "v1"
    v1 = jobs(store, "b", 2)
    assert claim(store, 10) == set(v1)
    store.app_version = "v2"
    assert claim(store, 10) == set(v2)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"fairness": "fifo"}, 'fairness: must be "round_robin"'),
        ({"fair_weights": {"a": 2}}, 'fair_weights: needs fairness="round_robin"'),
        ({"fairness": "round_robin", "fair_weights": {"a": 0}}, "must be from 1 to 1000"),
        ({"fairness": "round_robin", "fair_weights": {"a": 1.5}}, "a whole number of jobs"),
        ({"fairness": "round_robin", "fair_weights": {"": 2}}, "a non-empty string"),
        ({"fairness": "round_robin", "fair_weights": ["a"]}, "must map keys to weights"),
    ],
)
def test_bad_fairness_options_are_refused_naming_what_to_write(
    options: dict[str, Any], said: str
) -> None:
    with pytest.raises(InvalidKindOptions, match=None) as raised:
        KindOptions(**options)
    assert said in str(raised.value)
