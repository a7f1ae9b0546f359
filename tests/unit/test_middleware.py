"""Middleware over the in-memory store: order, jobs replaced at enqueue, a run wrapped in
the worker's thread (sync and async handlers), a middleware's exception failing the
attempt like a handler's, the settled notification, and what registering checks."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from typing import Any

import pytest

import brooq
from brooq.engine.fake import InMemoryStore
from brooq.engine.middleware import AsyncRunNext, EnqueueNext, RunNext
from brooq.vocabulary import Claim, Enqueued, Job, State

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")


class Recorder(brooq.Middleware):
    """Records every hook it sees, before and after going on."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def enqueue(self, jobs: list[Job], call_next: EnqueueNext) -> list[Enqueued]:
        self.calls.append(f"{self.name}>enqueue {len(jobs)}")
        done = call_next(jobs)
        self.calls.append(f"<{self.name}")
        return done

    def run(self, claim: Claim, call_next: RunNext) -> Any:
        self.calls.append(f"{self.name}>run {claim.topic}")
        result = call_next(claim)
        self.calls.append(f"<{self.name}")
        return result

    def settled(self, claim: Claim, settled: brooq.Settled) -> None:
        self.calls.append(f"{self.name} settled {settled.outcome}")


def test_middleware_wraps_enqueue_and_run_in_order_the_first_outermost() -> None:
    calls: list[str] = []
    queue = brooq.Queue(InMemoryStore(), middleware=[Recorder("a", calls)])
    queue.use(Recorder("b", calls))

    @queue.kind("report")
    def report(claim: Claim) -> None:
        calls.append("handler")

    queue.enqueue(Job("report"))
    queue.enqueue_many([Job("report"), Job("report")])
    once = ["a>enqueue 1", "b>enqueue 1", "<b", "<a"]
    assert calls == [*once, "a>enqueue 2", "b>enqueue 2", "<b", "<a"]
    calls.clear()
    queue.drain(max_jobs=1)
    assert calls == [
        "a>run report",
        "b>run report",
        "handler",
        "<b",
        "<a",
        "a settled done",
        "b settled done",
    ]
    assert [type(m).__name__ for m in queue.middleware] == ["Recorder", "Recorder"]


def test_an_enqueue_middleware_may_replace_the_jobs() -> None:
    class Urgent(brooq.Middleware):
        def enqueue(self, jobs: list[Job], call_next: EnqueueNext) -> list[Enqueued]:
            return call_next([dataclasses.replace(job, priority=9) for job in jobs])

    store = InMemoryStore()
    queue = brooq.Queue(store, middleware=[Urgent()])
    job_id = queue.enqueue(Job("report")).id
    assert store.get(job_id).priority == 9

    wf = brooq.Workflow()
    first = wf.add(Job("report"))
    second = wf.add(Job("report"), after=[first])
    written = queue.enqueue_workflow(wf)
    assert [e.id for e in written] == [first.id, second.id]  # same ids, same edges
    assert store.get(second.id).priority == 9 and store.get(second.id).state == State.WAITING


def test_an_enqueue_middleware_that_raises_enqueues_nothing() -> None:
    class Refuse(brooq.Middleware):
        def enqueue(self, jobs: list[Job], call_next: EnqueueNext) -> list[Enqueued]:
            raise PermissionError("no tenant")

    store = InMemoryStore()
    queue = brooq.Queue(store, middleware=[Refuse()])
    with pytest.raises(PermissionError, match="no tenant"):
        queue.enqueue_many([Job("report"), Job("report")])
    assert store.rows == {}


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_run_middleware_that_raises_fails_the_attempt_like_a_handler(where: str) -> None:
    ran: list[int] = []

    class Flaky(brooq.Middleware):
        def run(self, claim: Claim, call_next: RunNext) -> Any:
            if where == "after":
                call_next(claim)
            raise ConnectionError(f"tenant store down ({where})")

    queue = brooq.Queue(InMemoryStore(), middleware=[Flaky()])

    @queue.kind("report", max_attempts=2, backoff_base="1ms", backoff_max="1ms")
    def report(claim: Claim) -> None:
        ran.append(claim.attempt)

    job_id = queue.enqueue(Job("report")).id
    first = queue.drain()
    assert first.outcomes == {"failed": 1}
    row = queue.get(job_id)
    assert row.last_error == f"ConnectionError: tenant store down ({where})"
    assert row.last_traceback is not None and "test_middleware.py" in row.last_traceback
    assert ran == ([] if where == "before" else [1])


def test_a_middleware_exception_on_the_last_attempt_makes_the_job_dead() -> None:
    class Broken(brooq.Middleware):
        def run(self, claim: Claim, call_next: RunNext) -> Any:
            raise SystemExit(3)  # not even this stops the worker: it is the attempt's

    queue = brooq.Queue(InMemoryStore(), middleware=[Broken()])
    queue.register("report", lambda claim: None, max_attempts=1)
    job_id = queue.enqueue(Job("report")).id
    assert queue.drain().outcomes == {"dead": 1}
    assert queue.get(job_id).last_error == "SystemExit: 3"


def test_context_set_by_run_reaches_sync_and_async_handlers() -> None:
    loops: list[bool] = []

    class Tenant(brooq.Middleware):
        def run(self, claim: Claim, call_next: RunNext) -> Any:
            token = TENANT.set(claim.payload["tenant"])
            try:
                return call_next(claim)
            finally:
                TENANT.reset(token)

        async def run_async(self, claim: Claim, call_next: AsyncRunNext) -> Any:
            loops.append(asyncio.get_running_loop().is_running())
            return f"{await call_next(claim)} (in the loop)"

    queue = brooq.Queue(InMemoryStore(), middleware=[Tenant()])

    @queue.kind("sync")
    def sync(claim: Claim) -> str:
        return TENANT.get()

    @queue.kind("async")
    async def in_loop(claim: Claim) -> str:
        await asyncio.sleep(0)
        return TENANT.get()

    a = queue.enqueue(Job("sync", {"tenant": "t1"})).id
    b = queue.enqueue(Job("async", {"tenant": "t2"})).id
    assert queue.drain().outcomes == {"done": 2}
    assert queue.result(a) == "t1" and queue.result(b) == "t2 (in the loop)"
    assert loops == [True] and TENANT.get() == "none"


def test_settled_hears_each_outcome_and_its_error() -> None:
    heard: list[brooq.Settled] = []

    class Listen(brooq.Middleware):
        def settled(self, claim: Claim, settled: brooq.Settled) -> None:
            heard.append(settled)

    queue = brooq.Queue(InMemoryStore(), middleware=[Listen()])

    @queue.kind("report", max_attempts=2, backoff_base="1ms", backoff_max="1ms")
    def report(claim: Claim) -> None:
        if claim.payload == "bad":
            raise ValueError("bad payload")

    queue.enqueue(Job("report", "bad"))
    queue.drain()
    (failed,) = heard
    assert (failed.outcome, failed.state, failed.written) == ("failed", State.FAILED, True)
    assert isinstance(failed.error, ValueError) and failed.retry_in is not None
    assert failed.duration_s >= 0 and failed.started_at.tzinfo is not None


def test_a_failing_settled_hook_is_logged_and_the_job_is_done(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Noisy(brooq.Middleware):
        def settled(self, claim: Claim, settled: brooq.Settled) -> None:
            raise RuntimeError("exporter down")

    queue = brooq.Queue(InMemoryStore(), middleware=[Noisy()])
    queue.register("report", lambda claim: None)
    job_id = queue.enqueue(Job("report")).id
    with caplog.at_level(logging.WARNING, logger="brooq.middleware"):
        assert queue.drain().outcomes == {"done": 1}
    assert queue.get(job_id).state == State.DONE
    assert "middleware settled hook failed" in caplog.text


def test_settled_hears_a_done_that_its_settle_hook_turned_into_a_failure() -> None:
    heard: list[brooq.Settled] = []

    class Listen(brooq.Middleware):
        def settled(self, claim: Claim, settled: brooq.Settled) -> None:
            heard.append(settled)

    queue = brooq.Queue(InMemoryStore(), middleware=[Listen()])

    @queue.kind("report", max_attempts=1)
    def report(claim: Claim) -> None:
        claim.on_succeeded(lambda conn: conn.execute(str(1 / 0)))

    queue.enqueue(Job("report"))
    queue.drain()
    assert heard[0].outcome == "dead" and "ZeroDivisionError" in str(heard[0].error)


def test_registering_something_that_is_no_middleware_is_refused() -> None:
    queue = brooq.Queue(InMemoryStore())
    with pytest.raises(TypeError, match="defines none of the middleware hooks"):
        queue.use(object())  # type: ignore[type-var]
    with pytest.raises(TypeError, match="defines none"):
        queue.use(brooq.Middleware())


def test_a_hook_no_middleware_defines_is_not_called() -> None:
    class EnqueueOnly(brooq.Middleware):
        def enqueue(self, jobs: list[Job], call_next: EnqueueNext) -> list[Enqueued]:
            return call_next(jobs)

    queue = brooq.Queue(InMemoryStore(), middleware=[EnqueueOnly()])
    stack = queue.registry.middleware
    assert [len(stack.by_hook[h]) for h in ("enqueue", "run", "run_async", "settled")] == [
        1,
        0,
        0,
        0,
    ]
