"""Stored results through the public Queue API, on both stores: what a handler returns is kept
with its job and read back by ``queue.result``, which waits for the job to end.

The in-memory store and PostgreSQL must agree on every case (the contract suite's rule).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
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


def backends(pg: Any) -> int:
    """Connections to the test database, this test's own excepted."""
    row = pg.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone()
    return int(row[0])


@pytest.mark.timeout(60)
def test_a_hundred_waiting_threads_share_one_listener(dsn: str, pg: Any) -> None:
    # Issue 32, item 7: each waiter held a connection of its own; 110 exhausted the server.
    queue = brooq.Queue(dsn)
    queue.register("echo", lambda claim: claim.payload, max_attempts=1)
    ids = [queue.enqueue(brooq.Job("echo", {"n": n})).id for n in range(120)]
    got: dict[str, Any] = {}

    def wait(job_id: str) -> None:
        got[job_id] = queue.result(job_id, timeout=30)

    threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in ids]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and backends(pg) < 2:
        time.sleep(0.05)  # the store's connection, and the listener's
    time.sleep(1.5)  # every waiter has looked at its row and waits
    assert backends(pg) <= 2, "waiters hold connections of their own"
    worker = brooq.Queue(dsn)
    worker.register("echo", lambda claim: claim.payload, max_attempts=1)
    started = time.monotonic()
    worker.drain(topics=["echo"])
    for thread in threads:
        thread.join(timeout=max(0.1, started + 20 - time.monotonic()))
    assert got == {job_id: {"n": n} for n, job_id in enumerate(ids)}
    worker.close()

    async def many() -> list[Any]:
        more = [queue.enqueue(brooq.Job("echo", {"a": n})).id for n in range(40)]
        waiting = [asyncio.create_task(queue.result_async(i, timeout=30)) for i in more]
        await asyncio.sleep(1.0)
        count = await asyncio.to_thread(backends, pg)
        assert count <= 2, "asyncio waiters hold connections of their own"
        await asyncio.to_thread(queue.drain, topics=["echo"])
        return list(await asyncio.gather(*waiting))

    assert asyncio.run(many()) == [{"a": n} for n in range(40)]


@pytest.mark.timeout(60)
def test_the_shared_listener_reconnects_and_leaves_when_nobody_waits(
    dsn: str, pg: Any, admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from brooq.postgres import waiters

    monkeypatch.setattr(waiters, "LINGER_S", 0.5)
    queue = brooq.Queue(dsn)
    queue.register("echo", lambda claim: claim.payload, max_attempts=1)
    job_id = queue.enqueue(brooq.Job("echo", {"v": 1})).id
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(queue.result(job_id, timeout=20)))
    waiter.start()

    def listener_pid() -> int | None:
        row = pg.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN%%'"
        ).fetchone()
        return None if row is None else int(row[0])

    deadline = time.monotonic() + 10
    while listener_pid() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    first = listener_pid()
    assert first is not None
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (first,))
    while listener_pid() in (None, first) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listener_pid() not in (None, first), "the listener did not connect again"
    queue.drain(topics=["echo"])
    waiter.join(timeout=10)
    assert got == [{"v": 1}]
    # Nobody waits: past LINGER_S the listener closes its connection and its thread ends.
    deadline = time.monotonic() + 10
    while listener_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listener_pid() is None
    assert [s._thread for s in waiters._listeners.values() if s.dsn == dsn] == [None]
    queue.close()
