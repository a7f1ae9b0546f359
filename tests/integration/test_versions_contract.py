"""App versions (issue 34), one contract for the in-memory and the PostgreSQL store: a job
carries its enqueuer's version; a claimer takes its own version's jobs and those with none."""

from __future__ import annotations

from datetime import timedelta

import pytest

from brooq.engine.outcome import DONE
from brooq.engine.store import Store
from brooq.vocabulary import InvalidAppVersion, Job, RateLimit, Workflow, app_version
from tests.integration.test_contract import LEASE, Env, FakeEnv, PgEnv


@pytest.fixture(params=["fake", "postgres"])
def env(request: pytest.FixtureRequest) -> Env:
    """Each test runs once per store."""
    if request.param == "fake":
        return FakeEnv(request.getfixturevalue("fake_store"), request.getfixturevalue("clock"))
    return PgEnv(request.getfixturevalue("pg_store"), request.getfixturevalue("pg"))


def versioned(store: Store, version: str | None) -> Store:
    """The store, enqueuing and claiming as ``version`` from now on."""
    store.app_version = version  # type: ignore[attr-defined]
    return store


def enqueue_as(store: Store, version: str | None, n: int = 1) -> list[str]:
    versioned(store, version)
    return [e.id for e in store.enqueue_many([Job("work", {"i": i}) for i in range(n)])]


def claimed_ids(store: Store, version: str | None, topics: tuple[str, ...] = ("work",)) -> set[str]:
    versioned(store, version)
    return {c.id for c in store.claim_many("w", list(topics), LEASE, 1000)}


def test_jobs_carry_the_version_of_their_enqueuer(env: Env) -> None:
    store = env.store
    (v2,) = enqueue_as(store, "v2")
    (plain,) = enqueue_as(store, None)
    assert store.get(v2).app_version == "v2"
    assert store.get(plain).app_version is None


def test_a_supervisor_claims_its_own_version_and_unversioned_jobs_only(env: Env) -> None:
    store = env.store
    v1 = set(enqueue_as(store, "v1", 2))
    v2 = set(enqueue_as(store, "v2", 2))
    none = set(enqueue_as(store, None, 2))
    assert claimed_ids(store, "v1") == v1 | none
    assert claimed_ids(store, "v1") == set()  # v2's jobs never start on v1
    assert claimed_ids(store, None) == set()  # nor on an unversioned (older) supervisor
    assert claimed_ids(store, "v2") == v2


def test_an_unversioned_app_claims_every_job_it_wrote_as_before(env: Env) -> None:
    store = env.store
    ids = set(enqueue_as(store, None, 3))
    assert claimed_ids(store, None) == ids


def test_the_bulk_path_stamps_the_version_too(env: Env) -> None:
    store = env.store
    ids = set(enqueue_as(store, "v2", 200))  # 200 keyless jobs: COPY on PostgreSQL
    assert {store.get(i).app_version for i in ids} == {"v2"}
    assert claimed_ids(store, "v1") == set()
    assert claimed_ids(store, "v2") == ids


def test_limited_and_rated_claims_filter_the_version(env: Env) -> None:
    store = env.store
    v1 = set(enqueue_as(store, "v1", 3))
    v2 = set(enqueue_as(store, "v2", 3))
    versioned(store, "v1")
    capped = store.claim_many("w", ["work"], LEASE, 10, {"work": 10})
    assert {c.id for c in capped} == v1
    versioned(store, "v2")
    rates = {"work": RateLimit(100, timedelta(seconds=1), 100)}
    rated = store.claim_many("w", ["work"], LEASE, 10, {}, rates)
    assert {c.id for c in rated} == v2


def test_a_chained_child_carries_the_version_of_the_code_that_settled_its_parent(
    env: Env,
) -> None:
    store = env.store
    enqueue_as(store, "v2")
    versioned(store, "v2")
    claimed = store.claim("w", ["work"], LEASE)
    assert claimed is not None
    assert store.settle(claimed.ticket, DONE, chain=[Job("next", {})])
    (child,) = claimed_ids(store, "v2", ("next",))
    assert store.get(child).app_version == "v2"


@pytest.mark.parametrize("bad", ["", " v1", "v 1", "x" * 129, "é", "-v1"])
def test_a_bad_version_is_refused_with_what_to_do(bad: str) -> None:
    if bad == "":
        assert app_version(bad) is None  # empty: unset
        return
    with pytest.raises(InvalidAppVersion, match="app version"):
        app_version(bad)


def test_a_workflow_and_jobs_after_others_carry_their_enqueuers_version(env: Env) -> None:
    store = versioned(env.store, "v2")
    wf = Workflow()
    first = wf.add(Job("work", "a"))
    wf.add(Job("work", "b"), after=[first])
    written = store.enqueue_workflow(wf)
    (after,) = store.enqueue_many([Job("work", "c", after=[written[0].id])])
    assert {store.get(e.id).app_version for e in [*written, after]} == {"v2"}
    assert claimed_ids(store, "v1") == set()  # the parent is v2's: v1 never starts it
    assert claimed_ids(store, "v2") == {written[0].id}
