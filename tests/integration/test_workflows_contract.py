"""Workflows through the Store port, on the in-memory fake AND PostgreSQL (one suite, two stores).

A job enqueued after other jobs waits (``waiting``) until every parent has ended; the
write that ends its last parent makes it pending, or canceled by its policy, exactly
once: settle, settle_many, cancel, the reaper's dead, cancel_workflow and the reaper's
safety net for stranded edges alike. Retention leaves a parent whose children have not
ended. ``claim.parents`` reads the parents' states and results.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from brooq.engine.edges import MISSING_PARENT_GRACE
from brooq.engine.outcome import DONE
from brooq.engine.reaper import Reaper
from brooq.engine.store import Ticket
from brooq.engine.timer import Every
from brooq.vocabulary import (
    Claim,
    InvalidJob,
    Job,
    JobRecord,
    Parent,
    State,
    Workflow,
)
from tests.integration.helpers import run_one
from tests.integration.test_contract import (
    Env,
    FakeEnv,
    PgEnv,
    canceled_outcome,
    dead_outcome,
    failed_outcome,
)

LEASE = timedelta(minutes=1)
MISSING_ID = "01900000-0000-7000-8000-000000000001"


@pytest.fixture(params=["fake", "postgres"])
def env(request: pytest.FixtureRequest) -> Env:
    """Each test runs once per store (as the contract suite does)."""
    if request.param == "fake":
        return FakeEnv(request.getfixturevalue("fake_store"), request.getfixturevalue("clock"))
    return PgEnv(request.getfixturevalue("pg_store"), request.getfixturevalue("pg"))


def add(env: Env, topic: str = "work", **kw: Any) -> str:
    (result,) = env.store.enqueue_many([Job(topic, kw.pop("payload", None), **kw)])
    assert result.created
    return result.id


def take(env: Env, job_id: str, topic: str = "work") -> Ticket:
    """Claim ``job_id`` (the other ready jobs of ``topic`` are given back); its ticket."""
    claimed = env.store.claim_many("w1", [topic], LEASE, 1000)
    wanted = [c.ticket for c in claimed if c.id == job_id]
    env.store.release([c.ticket for c in claimed if c.id != job_id])
    assert wanted, f"{job_id} is not ready"
    return wanted[0]


def row(env: Env, job_id: str) -> JobRecord:
    return env.store.get(job_id)


def state(env: Env, job_id: str) -> State:
    return row(env, job_id).state


def delete_by_hand(env: Env, job_id: str) -> None:
    if isinstance(env, FakeEnv):
        del env.store.rows[job_id]
    else:
        env.pg.execute("DELETE FROM job WHERE id = %s", (job_id,))


# -- enqueue -----------------------------------------------------------------------------------


def test_a_child_waits_for_its_parents_and_is_not_claimable(env: Env) -> None:
    p1, p2 = add(env), add(env)
    (child,) = env.store.enqueue_many([Job("child", after=[p1, p2])])
    assert child.created and child.state is State.WAITING
    r = row(env, child.id)
    assert (r.state, r.parents_left, r.if_parent_fails) == (State.WAITING, 2, "cancel")
    assert env.store.claim("w1", ["child"], LEASE) is None
    assert env.store.parents(child.id) == {p1: Parent(State.PENDING), p2: Parent(State.PENDING)}


def test_parents_that_ended_before_the_enqueue_are_resolved_at_once(env: Env) -> None:
    done, dead = add(env), add(env)
    env.store.settle(take(env, done), DONE)
    env.store.settle(take(env, dead), dead_outcome())
    assert state(env, add(env, "child", after=[done])) is State.PENDING
    canceled = add(env, "child", after=[done, dead])
    r = row(env, canceled)
    assert r.state is State.CANCELED and r.last_error == f"canceled: parent {dead} ended dead"
    runs = add(env, "child", after=[dead], if_parent_fails="run")
    assert state(env, runs) is State.PENDING
    assert env.store.claim("w1", ["child"], LEASE) is not None


def past_grace(env: Env, *children: str) -> None:
    """Make ``children`` older than the grace an edge to an unseen parent is given."""
    for child in children:
        env.force(child, created_at=env.now() - MISSING_PARENT_GRACE - timedelta(seconds=1))


def test_a_missing_parent_is_waited_for_then_resolves_by_the_policy(env: Env) -> None:
    """Issue 32, item 12: a parent the enqueue cannot see may be in a transaction that has
    not committed yet; the child waits for it, and the reaper's safety net calls it missing
    only once the child is MISSING_PARENT_GRACE old."""
    cancels = add(env, "child", after=[MISSING_ID])
    runs = add(env, "child", after=[MISSING_ID], if_parent_fails="run")
    for child in (cancels, runs):
        r = row(env, child)
        assert (r.state, r.parents_left, r.last_error) == (State.WAITING, 1, None)
    assert env.store.parents(runs) == {MISSING_ID: Parent(None)}
    assert env.store.resolve_stranded() == 0  # within the grace: it may still commit
    past_grace(env, cancels)
    assert env.store.resolve_stranded() == 0  # every child waiting for it must be past it
    past_grace(env, runs)
    assert env.store.resolve_stranded() == 2
    r = row(env, cancels)
    assert r.state is State.CANCELED
    assert r.last_error == f"canceled: parent {MISSING_ID} does not exist"
    assert (state(env, runs), row(env, runs).parents_left) == (State.PENDING, 0)
    assert env.store.parents(runs) == {MISSING_ID: Parent(None)}
    assert env.store.resolve_stranded() == 0


def test_a_keyed_child_is_enqueued_once_with_its_edges(env: Env) -> None:
    parent = add(env)
    first = env.store.enqueue_many([Job("child", after=[parent], idempotency_key="k")])[0]
    again = env.store.enqueue_many([Job("child", after=[parent], idempotency_key="k")])[0]
    assert first.created and not again.created and again.id == first.id
    assert again.state is State.WAITING
    env.store.settle(take(env, parent), DONE)
    assert state(env, first.id) is State.PENDING


# -- the ending writes resolve the edges -------------------------------------------------------


@pytest.mark.parametrize("how", ["settle", "settle_many"])
def test_the_last_parent_done_makes_the_child_pending_exactly_once(env: Env, how: str) -> None:
    p1, p2 = add(env), add(env)
    child = add(env, "child", after=[p1, p2], available_at=None)
    created = row(env, child).available_at
    t1, t2 = take(env, p1), take(env, p2)

    def settle(ticket: Ticket) -> None:
        if how == "settle":
            assert env.store.settle(ticket, DONE)
        else:
            assert env.store.settle_many([(ticket, DONE)]) == {ticket.job_id}

    settle(t1)
    r = row(env, child)
    assert (r.state, r.parents_left) == (State.WAITING, 1)
    settle(t2)
    r = row(env, child)
    assert (r.state, r.parents_left) == (State.PENDING, 0)
    assert r.available_at >= created  # ready from when it became pending, not before
    assert env.store.claim("w1", ["child"], LEASE) is not None
    # Ending a parent again is impossible (terminal rows are never overwritten): no second fire.
    assert not env.store.settle(t2, DONE)
    assert row(env, child).parents_left == 0


def test_two_parents_ending_in_one_batch_fire_the_child_once(env: Env) -> None:
    p1, p2 = add(env), add(env)
    child = add(env, "child", after=[p1, p2])
    settled = env.store.settle_many([(take(env, p1), DONE), (take(env, p2), DONE)])
    assert settled == {p1, p2}
    r = row(env, child)
    assert (r.state, r.parents_left) == (State.PENDING, 0)


def test_a_failed_attempt_resolves_nothing(env: Env) -> None:
    parent = add(env)
    child = add(env, "child", after=[parent])
    env.store.settle(take(env, parent), failed_outcome())
    assert (row(env, child).state, row(env, child).parents_left) == (State.WAITING, 1)


@pytest.mark.parametrize(
    "end", ["dead", "canceled by the handler", "canceled by an operator", "dead by the reaper"]
)
def test_a_failed_parent_cancels_the_child_and_its_dependents(env: Env, end: str) -> None:
    parent = add(env)
    child = add(env, "child", after=[parent])
    grandchild = add(env, "child", after=[child])
    runs = add(env, "child", after=[child], if_parent_fails="run")
    if end == "dead":
        env.store.settle(take(env, parent), dead_outcome())
    elif end == "canceled by the handler":
        env.store.settle_many([(take(env, parent), canceled_outcome())])
    elif end == "canceled by an operator":
        assert env.store.cancel(parent)
    else:
        take(env, parent)
        env.expire(parent)
        Reaper(env.store, Every(timedelta(seconds=5)), max_expirations=1).run_once()
    ended = str(state(env, parent))
    assert ended in ("dead", "canceled")
    r = row(env, child)
    assert r.state is State.CANCELED and r.last_error == f"canceled: parent {parent} ended {ended}"
    g = row(env, grandchild)
    assert g.state is State.CANCELED
    assert g.last_error == f"canceled: parent {child} ended canceled"
    assert state(env, runs) is State.PENDING  # it runs anyway, and sees why
    assert env.store.parents(runs) == {child: Parent(State.CANCELED)}


def test_run_policy_waits_for_every_parent_even_after_one_failed(env: Env) -> None:
    failing, slow = add(env), add(env)
    child = add(env, "child", after=[failing, slow], if_parent_fails="run")
    env.store.settle(take(env, failing), dead_outcome())
    assert (row(env, child).state, row(env, child).parents_left) == (State.WAITING, 1)
    env.store.settle(take(env, slow), DONE)
    assert state(env, child) is State.PENDING


def test_canceling_a_waiting_child_resolves_its_own_children(env: Env) -> None:
    parent = add(env)
    child = add(env, "child", after=[parent])
    grandchild = add(env, "child", after=[child])
    assert env.store.cancel(child, "not needed")
    assert row(env, child).last_error == "canceled: not needed"
    assert state(env, grandchild) is State.CANCELED
    env.store.settle(take(env, parent), DONE)  # its edge to the canceled child resolves quietly
    assert state(env, child) is State.CANCELED and row(env, child).parents_left == 0


def test_a_parent_gone_by_hand_is_resolved_by_the_reapers_safety_net(env: Env) -> None:
    parent = add(env)
    cancels = add(env, "child", after=[parent])
    runs = add(env, "child", after=[parent], if_parent_fails="run")
    delete_by_hand(env, parent)
    assert env.store.resolve_stranded() == 0  # gone, or not committed yet: the grace
    past_grace(env, cancels, runs)
    assert env.store.resolve_stranded() == 2
    r = row(env, cancels)
    assert r.state is State.CANCELED and r.last_error == f"canceled: parent {parent} does not exist"
    assert state(env, runs) is State.PENDING
    assert env.store.resolve_stranded() == 0


def test_retention_keeps_a_parent_until_its_children_have_ended(env: Env) -> None:
    parent, other = add(env), add(env)
    child = add(env, "child", after=[parent, other])
    env.store.settle(take(env, parent), DONE)
    env.force(parent, updated_at=env.now() - timedelta(days=40))
    assert env.store.delete_terminal(timedelta(days=30), 100) == []
    assert env.store.parents(child)[parent].state is State.DONE
    env.store.settle(take(env, other), DONE)
    env.store.settle(take(env, child, "child"), DONE)
    assert [n for _, n in env.store.delete_terminal(timedelta(days=30), 100)] == [1]
    assert env.store.parents(child) == {parent: Parent(State.DONE), other: Parent(State.DONE)}


# -- workflows ---------------------------------------------------------------------------------


def test_a_workflow_is_written_at_once_with_its_id_and_runs_in_order(env: Env) -> None:
    wf = Workflow()
    a = wf.add(Job("work", "a"))
    b = wf.add(Job("work", "b"), after=[a])
    c = wf.add(Job("work", "c"), after=[a, b])
    written = env.store.enqueue_workflow(wf)
    assert [e.id for e in written] == [a.id, b.id, c.id]
    assert [e.state for e in written] == [State.PENDING, State.WAITING, State.WAITING]
    assert {row(env, h.id).workflow_id for h in wf} == {wf.id}
    order = []
    for _ in range(3):
        claimed = env.store.claim("w1", ["work"], LEASE)
        assert claimed is not None and env.store.claim("w1", ["work"], LEASE) is None
        order.append(claimed.payload)
        env.store.settle(claimed.ticket, DONE)
    assert order == ["a", "b", "c"]
    with pytest.raises(InvalidJob, match="enqueued already"):
        env.store.enqueue_workflow(wf)


def test_cancel_workflow_cancels_every_job_not_ended_in_one_call(env: Env) -> None:
    outside = add(env)
    wf = Workflow()
    a = wf.add(Job("work", "a"), after=[outside])
    b = wf.add(Job("work", "b"))
    c = wf.add(Job("work", "c"), after=[a, b])
    env.store.enqueue_workflow(wf)
    after_wf = add(env, "child", after=[c], if_parent_fails="run")
    canceled_with = add(env, "child", after=[c])
    running = take(env, b.id)
    assert env.store.cancel_workflow(wf.id, "stop") == 3
    assert [state(env, h.id) for h in wf] == [State.CANCELED] * 3
    assert row(env, a.id).last_error == "canceled: stop"
    assert not env.store.settle(running, DONE)  # the running one lost its lease
    assert state(env, after_wf) is State.PENDING
    assert state(env, canceled_with) is State.CANCELED
    assert env.store.cancel_workflow(wf.id) == 0
    env.store.settle(take(env, outside), DONE)
    assert state(env, a.id) is State.CANCELED


def test_a_job_canceled_at_enqueue_cancels_its_workflow_children(env: Env) -> None:
    dead = add(env)
    env.store.settle(take(env, dead), dead_outcome())
    wf = Workflow()
    a = wf.add(Job("work"), after=[dead])
    b = wf.add(Job("work"), after=[a])
    runs = wf.add(Job("work", if_parent_fails="run"), after=[a])
    written = env.store.enqueue_workflow(wf)
    assert [e.state for e in written] == [State.CANCELED, State.CANCELED, State.PENDING]
    assert row(env, b.id).last_error == f"canceled: parent {a.id} ended canceled"
    assert env.store.parents(runs.id) == {a.id: Parent(State.CANCELED)}


# -- what the handler sees ---------------------------------------------------------------------


def test_claim_parents_reads_states_and_results_only_when_asked(env: Env) -> None:
    p1, p2 = add(env, payload=1), add(env, payload=2)
    for _ in (p1, p2):
        run_one(env.store, lambda c: {"doubled": c.payload * 2})
    child = add(env, after=[p1, p2])
    reads: list[str] = []
    real = env.store.parents

    def counted(job_id: str) -> dict[str, Parent]:
        reads.append(job_id)
        return real(job_id)

    env.store.parents = counted  # type: ignore[method-assign]
    seen: list[dict[str, Parent]] = []
    run_one(env.store, lambda c: seen.append(dict(c.parents)))
    doubled = [Parent(State.DONE, {"doubled": 2}), Parent(State.DONE, {"doubled": 4})]
    assert seen == [dict(zip([p1, p2], doubled, strict=True))]
    assert reads == [child]
    plain = add(env)
    run_one(env.store, lambda c: None)  # a handler that never asks costs no read
    assert reads == [child] and state(env, plain) is State.DONE


def test_a_chained_child_of_the_settling_job_is_ready_at_once(env: Env) -> None:
    parent = add(env)

    def handler(claim: Claim) -> None:
        claim.chain(Job("child", after=[claim.id]))

    run_one(env.store, handler)
    assert state(env, parent) is State.DONE
    claimed = env.store.claim("w1", ["child"], LEASE)
    assert claimed is not None
    assert env.store.parents(claimed.id) == {parent: Parent(State.DONE)}
