"""Workflows in memory: Job(after=…) checked, a Workflow's graph (handles, cycles), the plan of
an enqueue (brooq.engine.edges), claim.parents read lazily."""

from __future__ import annotations

from typing import Any

import pytest

from brooq.engine.edges import cancel_reason, outside, plan
from brooq.vocabulary import (
    Claim,
    Enqueued,
    InvalidJob,
    Job,
    Lease,
    Node,
    Parent,
    State,
    Workflow,
)
from brooq.vocabulary.workflow import ordered

A = "01900000-0000-7000-8000-00000000000a"
B = "01900000-0000-7000-8000-00000000000b"
C = "01900000-0000-7000-8000-00000000000c"


def test_after_takes_ids_or_what_carries_one_each_once_in_order() -> None:
    job = Job("work", after=[B.upper(), Enqueued(A, True), f" {B} "])
    assert job.after_ids == (B, A)
    assert Job("work").after_ids == ()
    assert job == Job("work", after=(B, A))  # normalised: hashable and comparable


@pytest.mark.parametrize(
    ("after", "message"),
    [
        (A, "must be a list of job ids"),
        (["nope"], "is not a job id"),
        ([42], "holds int, not a job id"),
        (None, "must be a list of job ids"),
    ],
)
def test_bad_after_is_refused_before_anything_is_written(after: Any, message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        Job("work", after=after)


def test_if_parent_fails_is_cancel_or_run() -> None:
    assert Job("work").if_parent_fails == "cancel"
    with pytest.raises(InvalidJob, match="'cancel' or 'run'"):
        Job("work", after=[A], if_parent_fails="ignore")  # type: ignore[arg-type]


def test_a_workflow_adds_jobs_after_handles_of_its_own() -> None:
    wf = Workflow()
    a = wf.add(Job("work"))
    b = wf.add(Job("work", after=[C]), after=[a, A])
    assert len(wf) == 2 and [h.id for h in wf] == [a.id, b.id]
    assert a.workflow_id == wf.id and a.id < b.id  # ids in the order added
    nodes = wf.nodes()
    assert [n.parents for n in nodes] == [(), (a.id, A, C)]
    assert nodes[1].job.after_ids == ()  # its parents live in the node


def test_a_handle_of_another_workflow_or_a_keyed_job_is_refused() -> None:
    other = Workflow().add(Job("work"))
    wf = Workflow()
    with pytest.raises(InvalidJob, match="not a job of this workflow"):
        wf.add(Job("work"), after=[other])
    with pytest.raises(InvalidJob, match="cannot carry an idempotency key"):
        wf.add(Job("work", idempotency_key="k"))
    with pytest.raises(TypeError):
        wf.add("work")  # type: ignore[arg-type]
    with pytest.raises(InvalidJob, match="list of job ids"):
        wf.add(Job("work"), after=A)
    assert len(wf) == 0
    with pytest.raises(InvalidJob, match="workflow id"):
        Workflow(id="nope")


def test_a_cycle_is_refused_naming_a_job_on_it() -> None:
    job = Job("work")
    with pytest.raises(InvalidJob, match=f"cycle \\(job {A} is on one\\)"):
        ordered([Node(A, job, (B,)), Node(B, job, (A,)), Node(C, job, ())])
    with pytest.raises(InvalidJob, match="cycle"):
        ordered([Node(A, job, (A,))])
    with pytest.raises(InvalidJob, match="same job twice"):
        ordered([Node(A, job, ()), Node(A, job, ())])
    # Parents first, the order of adding kept among the ready ones:
    got = ordered([Node(C, job, (A,)), Node(B, job, ()), Node(A, job, (B,))])
    assert [n.id for n in got] == [B, A, C]


def test_plan_resolves_ended_parents_waits_for_unseen_ones_and_cancels_transitively() -> None:
    job, runs = Job("work"), Job("work", if_parent_fails="run")
    nodes = [
        Node("n1", job, (A,)),  # A running: waits
        Node("n2", job, (B,)),  # B dead: canceled
        Node("n3", job, ("n2",)),  # its parent canceled at enqueue: canceled too
        Node("n4", runs, ("n2", A)),  # runs anyway, once A ends
        Node("n5", runs, (C,)),  # C not visible (not committed yet?): waits for it
        Node("n6", job, ()),
    ]
    got = {p.id: p for p in plan(nodes, {A: State.PROCESSING, B: State.DEAD}, "wf")}
    assert got["n1"].state is State.WAITING and got["n1"].parents == ((A, None),)
    assert got["n2"].state is State.CANCELED and got["n2"].reason == cancel_reason(B, "dead")
    assert got["n3"].reason == "canceled: parent n2 ended canceled"
    assert (got["n4"].state, got["n4"].parents_left) == (State.WAITING, 1)
    assert got["n5"].state is State.WAITING and got["n5"].parents == ((C, None),)
    assert got["n5"].policy == "run" and got["n6"].policy is None and got["n6"].workflow_id == "wf"
    assert cancel_reason(C, "missing") == f"canceled: parent {C} does not exist"
    assert outside(nodes) == [A, B, C]


def test_claim_parents_are_read_once_and_only_when_asked() -> None:
    reads: list[str] = []

    def read() -> dict[str, Parent]:
        reads.append("read")
        return {A: Parent(State.DONE, {"n": 1})}

    claim = Claim(A, "work", None, 1, Lease("h", None), _read_parents=read)  # type: ignore[arg-type]
    assert reads == []
    assert claim.parents == {A: Parent(State.DONE, {"n": 1})} and claim.parents[A].result == {
        "n": 1
    }
    assert claim.parents is claim.parents and reads == ["read"]
    assert Claim(A, "work", None, 1, Lease("h", None)).parents == {}  # type: ignore[arg-type]
    assert Parent(None).failed and Parent(None).ended and not Parent(State.DONE).failed
    assert Parent(State.CANCELED).failed and not Parent(State.PENDING).ended
