"""Stored results through the public Queue API, on both stores: what a handler returns is kept
with its job and read back by ``queue.result``, which waits for the job to end.

The in-memory store and PostgreSQL must agree on every case (the contract suite's rule).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import brooq
from brooq.engine.fake import InMemoryStore

pytestmark = pytest.mark.db


@pytest.fixture(params=["fake", "postgres"])
def queue(request: pytest.FixtureRequest) -> brooq.Queue:
    """A queue on each store, with kinds that return what their payload says."""
    if request.param == "fake":
        q = brooq.Queue(InMemoryStore(), max_result_bytes=1000)
    else:
        q = brooq.Queue(request.getfixturevalue("dsn"), max_result_bytes=1000)

    @q.kind("echo", max_attempts=1)
    def echo(claim: brooq.Claim) -> Any:
        return answer(claim)

    @q.kind("retried", max_attempts=2, backoff_base="1m", backoff_max="1m")
    def retried(claim: brooq.Claim) -> Any:
        return answer(claim)

    def answer(claim: brooq.Claim) -> Any:
        payload = claim.payload or {}
        if payload.get("object"):
            return object()  # not JSON
        if payload.get("big"):
            return "x" * 2000
        return payload.get("value")

    @q.kind("fails", max_attempts=1)
    def fails(claim: brooq.Claim) -> None:
        raise RuntimeError("this one fails")

    @q.kind("effects")
    def effects(claim: brooq.Claim) -> dict[str, int]:
        claim.chain(brooq.Job("reads", {"parent": claim.id}))
        return {"n": 7}

    @q.kind("reads")
    def reads(claim: brooq.Claim) -> Any:
        # A chained job reads the result of the job that chained it: that job is done
        # (chain enqueues only with `done`, in the same transaction as its result).
        parent = q.result(claim.payload["parent"], timeout=0)
        return {"parent said": parent}

    return q


def enqueue(queue: brooq.Queue, topic: str, payload: Any = None) -> str:
    return queue.enqueue(brooq.Job(topic, payload)).id


def test_a_returned_value_is_stored_with_its_job(queue: brooq.Queue) -> None:
    value = {"total": 3, "items": ["a", "é"], "ok": True}
    job_id = enqueue(queue, "echo", {"value": value})
    nothing = enqueue(queue, "echo", {})
    queue.drain()
    assert queue.result(job_id) == value
    assert queue.get(job_id).result == value
    assert queue.result(nothing) is None and queue.get(nothing).result is None


def test_a_job_that_ended_without_success_raises_job_failed(queue: brooq.Queue) -> None:
    dead = enqueue(queue, "fails")
    canceled = enqueue(queue, "echo", {"value": 1})
    queue.cancel(canceled, reason="not wanted")
    queue.drain()
    with pytest.raises(brooq.JobDead) as died:
        queue.result(dead)
    assert died.value.state is brooq.State.DEAD
    assert "this one fails" in (died.value.last_error or "")
    with pytest.raises(brooq.JobCanceled) as cancel:
        queue.result(canceled, timeout=1)
    assert isinstance(cancel.value, brooq.JobFailed)
    assert "not wanted" in (cancel.value.last_error or "")


def test_an_unfinished_job_times_out_and_an_unknown_one_is_not_found(queue: brooq.Queue) -> None:
    pending = enqueue(queue, "echo", {"value": 1})
    started = time.monotonic()
    with pytest.raises(brooq.ResultTimeout) as timed_out:
        queue.result(pending, timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 2
    assert timed_out.value.state is brooq.State.PENDING
    with pytest.raises(brooq.JobNotFound):
        queue.result("01a2b3c4-0000-7000-8000-000000000000", timeout=0.1)
    with pytest.raises(brooq.JobNotFound):
        queue.result("not an id")


def test_a_result_that_is_not_json_or_too_large_fails_the_attempt(queue: brooq.Queue) -> None:
    not_json = enqueue(queue, "retried", {"object": True})
    too_big = enqueue(queue, "echo", {"big": True})
    queue.drain()
    first = queue.get(not_json)
    assert first.state is brooq.State.FAILED  # retries apply, as for any exception
    assert (first.last_error or "").startswith("ResultNotJSON: ")
    with pytest.raises(brooq.JobDead) as died:
        queue.result(too_big)
    assert died.value.last_error is not None
    assert died.value.last_error.startswith("ResultTooLarge: ")
    assert "> 1000" in died.value.last_error


def test_a_waiter_wakes_when_the_job_ends(queue: brooq.Queue) -> None:
    job_id = enqueue(queue, "echo", {"value": [1, 2]})
    timer = threading.Timer(0.3, queue.drain)
    timer.start()
    started = time.monotonic()
    try:
        assert queue.result(job_id, timeout=10) == [1, 2]
    finally:
        timer.join()
    assert time.monotonic() - started < 1.5


def test_result_async_is_the_same_for_asyncio_apps(queue: brooq.Queue) -> None:
    done = enqueue(queue, "echo", {"value": "x"})
    pending = enqueue(queue, "fails")
    queue.drain(topics=["echo"])

    async def main() -> tuple[Any, BaseException | None]:
        value = await queue.result_async(done, timeout=5)
        try:
            await queue.result_async(pending, timeout=0.2)
        except brooq.ResultTimeout as exc:
            return value, exc
        return value, None

    value, error = asyncio.run(main())
    assert value == "x" and isinstance(error, brooq.ResultTimeout)


def test_a_chained_job_reads_the_result_of_the_job_that_chained_it(queue: brooq.Queue) -> None:
    parent = enqueue(queue, "effects")
    drained = queue.drain()
    assert queue.result(parent) == {"n": 7}  # written with the chain, in one transaction
    (child,) = [a.claimed.id for a in drained.attempts if a.claimed.topic == "reads"]
    assert queue.result(child) == {"parent said": {"n": 7}}
