"""The slot runner over the in-memory store, and the vocabulary it is built from.

Covers claim → handler → settle, handlers that raise anything (BaseException
included), async handlers, soft timeouts and interrupts delivered by real
signals, settle hooks, the Queue facade with ``drain()``, and the validation
of kind options, topics, jobs, payloads, durations and job ids.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import brooq
from brooq.engine.fake import Executed, InMemoryStore, RecordingConnection
from brooq.engine.kinds import Registry
from brooq.engine.outcome import SettleKind
from brooq.engine.runner import Attempted, SlotRunner
from brooq.engine.store import Claimed
from brooq.testing import InMemoryStore as PublicInMemoryStore
from brooq.vocabulary import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    IDEMPOTENCY_KEY_MAX_LENGTH,
    TOPIC_MAX_LENGTH,
    AttemptTimedOut,
    CancelJob,
    Claim,
    Delay,
    InvalidJob,
    InvalidKindOptions,
    InvalidTopic,
    Job,
    JobCanceledWhileRunning,
    KindOptions,
    LeaseLost,
    PreserveAttempt,
    State,
    Topic,
    encode_payload,
    format_duration,
    new_job_id,
    parse_duration,
)

LEASE = timedelta(minutes=1)
HOLDER = "host:1234"
WAIT_S = 3.0  # the longest any handler here waits for an interrupt before giving up


class CustomBase(BaseException):
    """Neither an Exception nor a brooq signal."""


class Recorder:
    """A RunListener keeping every event."""

    def __init__(self) -> None:
        self.claimed: list[tuple[Claimed, KindOptions]] = []
        self.settled: list[Attempted] = []

    def on_claimed(self, claimed: Claimed, options: KindOptions) -> None:
        self.claimed.append((claimed, options))

    def on_settled(self, attempted: Attempted) -> None:
        self.settled.append(attempted)


class Listener:
    def __init__(self, recorder: Recorder) -> None:
        self.claimed = recorder.on_claimed
        self.settled = recorder.on_settled


class Rig:
    """A registry, a runner and the fake store, with shortcuts."""

    def __init__(self, store: InMemoryStore, clock: Any) -> None:
        self.store, self.clock = store, clock
        self.registry = Registry()
        self.events = Recorder()
        self.runner = SlotRunner(
            store, self.registry, HOLDER, LEASE, topics=[], listener=Listener(self.events)
        )

    def kind(self, topic: str, handler: Callable[[Claim], Any], **options: Any) -> None:
        self.registry.register(topic, handler, KindOptions(**options))

    def enqueue(self, topic: str, payload: Any = None, **job: Any) -> str:
        return self.store.enqueue_many([Job(topic, payload, **job)])[0].id

    def run(self) -> Attempted:
        self.runner.topics = self.registry.topics()
        attempted = self.runner.run_once()
        assert attempted is not None, "no job was ready"
        return attempted

    def row(self, job_id: str) -> brooq.JobRecord:
        return self.store.get(job_id)

    def later(self, delta: timedelta = timedelta(days=1)) -> None:
        self.clock.advance(delta)


@pytest.fixture
def rig(fake_store: InMemoryStore, clock: Any) -> Iterator[Rig]:
    rig = Rig(fake_store, clock)
    yield rig
    rig.runner.close()


def wait_for_interrupt() -> None:
    """Sleep in small steps (a handler doing blocking work) for at most WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.005)


def send_soon(signum: int, delay: float = 0.05) -> threading.Timer:
    timer = threading.Timer(delay, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()
    return timer


# --- claim → handler → settle ---------------------------------------------------------------


def test_nothing_ready_returns_none(rig: Rig) -> None:
    rig.kind("email.send", lambda claim: None)
    rig.runner.topics = rig.registry.topics()
    assert rig.runner.run_once() is None
    assert rig.events.claimed == []
    assert rig.events.settled == []


def test_claim_runs_handler_and_settles_done(rig: Rig) -> None:
    seen: list[Claim] = []
    rig.kind("email.send", seen.append, max_attempts=3, attempt_timeout="30s")
    job_id = rig.enqueue("email.send", {"to": "a@example.com", "n": [1, 2]})

    attempted = rig.run()

    assert attempted.outcome.kind is SettleKind.DONE
    assert attempted.written
    assert attempted.duration_s >= 0
    [claim] = seen
    assert claim.id == job_id
    assert claim.topic == "email.send"
    assert claim.payload == {"to": "a@example.com", "n": [1, 2]}
    assert claim.attempt == 1
    assert claim.max_attempts == 3
    assert not claim.is_last_attempt
    assert claim.lease.holder == HOLDER
    assert claim.lease.until == rig.clock.now + LEASE
    assert claim.deadline is not None
    assert timedelta(seconds=25) < claim.deadline - datetime.now(UTC) <= timedelta(seconds=30)
    row = rig.row(job_id)
    assert row.state is State.DONE
    assert row.attempts == 1
    assert row.last_error is None
    assert [c.id for c, _ in rig.events.claimed] == [job_id]
    assert rig.events.claimed[0][1].max_attempts == 3
    assert rig.events.settled == [attempted]


def test_jobs_run_in_available_at_then_enqueue_order(rig: Rig) -> None:
    order: list[Any] = []
    rig.kind("a", lambda claim: order.append(claim.payload))
    for n in range(5):
        rig.enqueue("a", n)
    rig.enqueue("a", "early", available_at=rig.clock.now - timedelta(seconds=1))
    for _ in range(6):
        rig.run()
    assert order == ["early", 0, 1, 2, 3, 4]


@pytest.mark.parametrize("value", [42, "kept", False, {"a": 1}, [None], None])
def test_a_handler_return_value_is_kept_as_the_result(rig: Rig, value: Any) -> None:
    rig.kind("a", lambda claim: value)
    job_id = rig.enqueue("a")
    assert rig.run().outcome.kind is SettleKind.DONE
    row = rig.row(job_id)
    assert row.state is State.DONE and row.result == value


@pytest.mark.parametrize(
    ("value", "error"),
    [(object(), "ResultNotJSON: "), (float("nan"), "ResultNotJSON: "), ("\x00", "ResultNotJSON")],
)
def test_a_result_that_is_not_json_fails_the_attempt(rig: Rig, value: Any, error: str) -> None:
    rig.kind("a", lambda claim: value, max_attempts=1)
    job_id = rig.enqueue("a")
    rig.run()
    row = rig.row(job_id)
    assert row.state is State.DEAD and (row.last_error or "").startswith(error)


def test_failure_retries_with_backoff_then_dies(rig: Rig) -> None:
    def fail(claim: Claim) -> None:
        raise ValueError(f"attempt {claim.attempt} broke")

    rig.kind("a", fail, max_attempts=2, backoff_base="10s", backoff_max="1m")
    job_id = rig.enqueue("a")

    first = rig.run()
    row = rig.row(job_id)
    assert first.outcome.kind is SettleKind.FAILED
    assert row.state is State.FAILED
    assert row.attempts == 1
    assert row.last_error == "ValueError: attempt 1 broke"
    assert rig.clock.now + timedelta(seconds=5) <= row.available_at
    assert row.available_at <= rig.clock.now + timedelta(seconds=10)
    assert rig.runner.run_once() is None  # not ready before its backoff

    rig.later()
    second = rig.run()
    row = rig.row(job_id)
    assert second.outcome.kind is SettleKind.DEAD
    assert row.state is State.DEAD
    assert row.attempts == 2
    assert row.last_error == "ValueError: attempt 2 broke"


def test_last_attempt_is_visible_to_the_handler(rig: Rig) -> None:
    flags: list[bool] = []

    def handler(claim: Claim) -> None:
        flags.append(claim.is_last_attempt)
        raise RuntimeError("again")

    rig.kind("a", handler, max_attempts=2)
    rig.enqueue("a")
    rig.run()
    rig.later()
    rig.run()
    assert flags == [False, True]


def test_unregistered_topic_is_a_recorded_failure(rig: Rig) -> None:
    job_id = rig.enqueue("ghost.topic")
    rig.runner.topics = ["ghost.topic"]
    attempted = rig.runner.run_once()
    assert attempted is not None
    assert attempted.outcome.kind is SettleKind.FAILED
    row = rig.row(job_id)
    assert row.state is State.FAILED
    assert row.last_error is not None and "KindNotRegistered" in row.last_error


# --- signals raised by handlers --------------------------------------------------------------


def test_delay_retries_at_the_delay_without_refund(rig: Rig) -> None:
    def handler(claim: Claim) -> None:
        raise Delay(20)

    rig.kind("a", handler, max_attempts=3, backoff_max="1m")
    job_id = rig.enqueue("a")
    attempted = rig.run()
    row = rig.row(job_id)
    assert attempted.outcome.label == "delayed"
    assert row.state is State.FAILED
    assert row.available_at == rig.clock.now + timedelta(seconds=20)
    assert row.attempts == 1


def test_preserve_attempt_gives_the_attempt_back(rig: Rig) -> None:
    def handler(claim: Claim) -> None:
        raise PreserveAttempt("rate limited")

    rig.kind("a", handler, max_attempts=1)
    job_id = rig.enqueue("a")
    for _ in range(3):
        attempted = rig.run()
        assert attempted.outcome.label == "preserved"
        row = rig.row(job_id)
        assert row.state is State.FAILED  # never dead, even with one attempt
        assert row.attempts == 0
        rig.later()


def test_cancel_job_cancels(rig: Rig) -> None:
    def handler(claim: Claim) -> None:
        try:
            raise KeyError("gone")
        except KeyError as err:
            raise CancelJob("customer deleted") from err

    rig.kind("a", handler, max_attempts=5)
    job_id = rig.enqueue("a")
    assert rig.run().outcome.kind is SettleKind.CANCELED
    row = rig.row(job_id)
    assert row.state is State.CANCELED
    assert row.last_error is not None and "customer deleted" in row.last_error


# --- handlers raising BaseException ---------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "name"),
    [
        (SystemExit(2), "SystemExit"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (CustomBase("custom"), "CustomBase"),
    ],
)
@pytest.mark.parametrize("is_async", [False, True])
def test_base_exception_in_handler_is_a_failure_and_runner_survives(
    rig: Rig, error: BaseException, name: str, is_async: bool
) -> None:
    async def bad_async(claim: Claim) -> None:
        await asyncio.sleep(0)
        raise error

    def bad_sync(claim: Claim) -> None:
        raise error

    rig.kind("bad", bad_async if is_async else bad_sync, max_attempts=3)
    rig.kind("good", lambda claim: None)
    bad_id = rig.enqueue("bad")
    attempted = rig.run()
    assert attempted.outcome.kind is SettleKind.FAILED
    row = rig.row(bad_id)
    assert row.state is State.FAILED
    assert row.last_error is not None and name in row.last_error

    good_id = rig.enqueue("good")
    assert rig.run().outcome.kind is SettleKind.DONE
    assert rig.row(good_id).state is State.DONE


# --- async handlers -------------------------------------------------------------------------


def test_async_handler_done(rig: Rig) -> None:
    seen: list[int] = []

    async def handler(claim: Claim) -> str:
        await asyncio.sleep(0.001)
        seen.append(claim.attempt)
        return "ignored"

    rig.kind("a", handler)
    ids = [rig.enqueue("a") for _ in range(3)]
    for _ in ids:
        assert rig.run().outcome.kind is SettleKind.DONE
    assert seen == [1, 1, 1]
    assert all(rig.row(i).state is State.DONE for i in ids)


def test_async_handler_raising_is_a_failure(rig: Rig) -> None:
    async def handler(claim: Claim) -> None:
        await asyncio.sleep(0)
        raise ValueError("async broke")

    rig.kind("a", handler, max_attempts=2)
    job_id = rig.enqueue("a")
    assert rig.run().outcome.kind is SettleKind.FAILED
    assert rig.row(job_id).last_error == "ValueError: async broke"


@pytest.mark.parametrize(
    ("signal_", "label", "state"),
    [
        (CancelJob("no"), "canceled", State.CANCELED),
        (Delay(7), "delayed", State.FAILED),
        (PreserveAttempt(), "preserved", State.FAILED),
    ],
)
def test_async_handler_signals(rig: Rig, signal_: BaseException, label: str, state: State) -> None:
    async def handler(claim: Claim) -> None:
        await asyncio.sleep(0)
        raise signal_

    rig.kind("a", handler, max_attempts=3)
    job_id = rig.enqueue("a")
    assert rig.run().outcome.label == label
    assert rig.row(job_id).state is state


def test_sync_handler_returning_a_coroutine_is_awaited(rig: Rig) -> None:
    seen: list[str] = []

    async def work(claim: Claim) -> None:
        seen.append(claim.id)

    rig.kind("a", lambda claim: work(claim))
    job_id = rig.enqueue("a")
    assert rig.run().outcome.kind is SettleKind.DONE
    assert seen == [job_id]


# --- soft timeouts --------------------------------------------------------------------------


def test_sync_handler_past_attempt_timeout_is_interrupted(rig: Rig) -> None:
    seen: list[type[BaseException]] = []

    def slow(claim: Claim) -> None:
        try:
            wait_for_interrupt()
        except BaseException as exc:
            seen.append(type(exc))
            raise

    rig.kind("slow", slow, attempt_timeout="200ms", max_attempts=3)
    job_id = rig.enqueue("slow")
    started = time.monotonic()
    attempted = rig.run()
    elapsed = time.monotonic() - started

    assert seen == [AttemptTimedOut]
    assert 0.15 <= elapsed < 1.5
    assert attempted.outcome.kind is SettleKind.FAILED
    row = rig.row(job_id)
    assert row.state is State.FAILED
    assert row.last_error is not None
    assert "AttemptTimedOut" in row.last_error and "timed out" in row.last_error


def test_async_handler_past_attempt_timeout_is_interrupted(rig: Rig) -> None:
    seen: list[type[BaseException]] = []

    async def slow(claim: Claim) -> None:
        try:
            await asyncio.sleep(10)
        except BaseException as exc:
            seen.append(type(exc))
            raise

    rig.kind("slow", slow, attempt_timeout="200ms", max_attempts=3)
    job_id = rig.enqueue("slow")
    started = time.monotonic()
    attempted = rig.run()
    elapsed = time.monotonic() - started

    assert seen == [asyncio.CancelledError]  # coroutines see a cancellation
    assert 0.15 <= elapsed < 1.5, f"the event loop was not woken: {elapsed:.2f}s"
    assert attempted.outcome.kind is SettleKind.FAILED
    row = rig.row(job_id)
    assert row.state is State.FAILED
    assert row.last_error is not None and "AttemptTimedOut" in row.last_error


def test_timeout_on_the_last_attempt_is_dead(rig: Rig) -> None:
    rig.kind("slow", lambda claim: wait_for_interrupt(), attempt_timeout="100ms", max_attempts=1)
    job_id = rig.enqueue("slow")
    assert rig.run().outcome.kind is SettleKind.DEAD
    assert rig.row(job_id).state is State.DEAD


def test_timeout_alarm_is_disarmed_after_a_quick_attempt(rig: Rig) -> None:
    rig.kind("quick", lambda claim: None, attempt_timeout="100ms")
    rig.enqueue("quick")
    before = signal.getitimer(signal.ITIMER_REAL)[0]  # pytest-timeout's own alarm, if any
    assert rig.run().outcome.kind is SettleKind.DONE
    after = signal.getitimer(signal.ITIMER_REAL)[0]
    assert after == 0 if before == 0 else 0 < after <= before  # given back, not ours
    time.sleep(0.2)  # past the timeout: no alarm may fire into the test
    assert rig.runner.interrupts.fired is None


# --- interrupts by signal -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "expected"),
    [(signal.SIGUSR1, LeaseLost), (signal.SIGUSR2, JobCanceledWhileRunning)],
)
def test_interrupt_signal_abandons_the_attempt(
    rig: Rig, signum: int, expected: type[BaseException]
) -> None:
    seen: list[type[BaseException]] = []
    timers: list[threading.Timer] = []

    def handler(claim: Claim) -> None:
        timers.append(send_soon(signum))
        try:
            wait_for_interrupt()
        except BaseException as exc:
            seen.append(type(exc))
            raise

    rig.kind("a", handler, max_attempts=1)
    job_id = rig.enqueue("a")
    before = rig.row(job_id)
    attempted = rig.run()
    timers[0].join(WAIT_S)

    assert seen == [expected]
    assert attempted.outcome.kind is SettleKind.ABANDON
    assert attempted.outcome.state is None
    assert not attempted.written
    row = rig.row(job_id)
    assert row.state is State.PROCESSING  # nothing written: the row is left as claimed
    assert row.locked_by == HOLDER
    assert row.attempts == 1
    assert row.last_error is None
    assert row.available_at == before.available_at
    assert rig.events.settled == [attempted]


def test_interrupt_signal_cancels_an_async_handler(rig: Rig) -> None:
    timers: list[threading.Timer] = []

    async def handler(claim: Claim) -> None:
        timers.append(send_soon(signal.SIGUSR1))
        await asyncio.sleep(10)

    rig.kind("a", handler)
    job_id = rig.enqueue("a")
    started = time.monotonic()
    attempted = rig.run()
    timers[0].join(WAIT_S)
    assert time.monotonic() - started < 1.5
    assert attempted.outcome.kind is SettleKind.ABANDON
    assert rig.row(job_id).state is State.PROCESSING


def test_interrupted_handler_cannot_swallow_with_except_exception(rig: Rig) -> None:
    timers: list[threading.Timer] = []

    def handler(claim: Claim) -> None:
        timers.append(send_soon(signal.SIGUSR1))
        try:
            wait_for_interrupt()
        except Exception:  # what careless handlers write
            return

    rig.kind("a", handler)
    rig.enqueue("a")
    attempted = rig.run()
    timers[0].join(WAIT_S)
    assert attempted.outcome.kind is SettleKind.ABANDON


def test_signal_outside_an_attempt_is_ignored(rig: Rig) -> None:
    rig.kind("a", lambda claim: None)
    rig.enqueue("a")
    rig.run()  # installs the handlers
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        os.kill(os.getpid(), signum)
        time.sleep(0.01)  # let the Python-level handler run here, between attempts
    assert rig.runner.interrupts.fired is None

    job_id = rig.enqueue("a")
    assert rig.run().outcome.kind is SettleKind.DONE  # the next attempt is not affected
    assert rig.row(job_id).state is State.DONE


def test_signal_from_another_thread_between_attempts_is_ignored(rig: Rig) -> None:
    rig.runner.interrupts.install()
    timer = send_soon(signal.SIGUSR1, delay=0.01)
    timer.join(WAIT_S)
    time.sleep(0.02)
    rig.kind("a", lambda claim: None)
    rig.enqueue("a")
    assert rig.run().outcome.kind is SettleKind.DONE


def test_close_restores_the_applications_signal_handlers(fake_store: InMemoryStore) -> None:
    received: list[int] = []

    def mine(signum: int, frame: object) -> None:
        received.append(signum)

    previous = signal.signal(signal.SIGUSR1, mine)
    try:
        registry = Registry()
        registry.register("a", lambda claim: None, KindOptions())
        fake_store.enqueue_many([Job("a")])
        runner = SlotRunner(fake_store, registry, HOLDER, LEASE)
        assert runner.run_once() is not None
        assert signal.getsignal(signal.SIGUSR1) is not mine
        runner.close()
        assert signal.getsignal(signal.SIGUSR1) is mine
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert received == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_runner_outside_the_main_thread_runs_without_interrupts(
    fake_store: InMemoryStore,
) -> None:
    registry = Registry()
    registry.register("a", lambda claim: None, KindOptions(attempt_timeout="1s"))
    job_id = fake_store.enqueue_many([Job("a")])[0].id
    results: list[Attempted | None] = []
    runner = SlotRunner(fake_store, registry, HOLDER, LEASE)
    thread = threading.Thread(target=lambda: results.append(runner.run_once()))
    thread.start()
    thread.join(WAIT_S)
    runner.close()
    assert results and results[0] is not None
    assert results[0].outcome.kind is SettleKind.DONE
    assert fake_store.get(job_id).state is State.DONE


# --- chain and on_succeeded -----------------------------------------------------------------


def test_chain_and_hooks_run_on_success(rig: Rig) -> None:
    def handler(claim: Claim) -> None:
        claim.chain(Job("next.step", {"from": claim.id}))
        claim.on_succeeded(
            lambda conn: conn.execute("INSERT INTO receipts (job_id) VALUES (%s)", (claim.id,))
        )

    rig.kind("a", handler)
    rig.kind("next.step", lambda claim: None)
    job_id = rig.enqueue("a")
    assert rig.run().outcome.kind is SettleKind.DONE
    chained = [r for r in rig.store.rows.values() if r.topic == "next.step"]
    assert len(chained) == 1
    assert chained[0].payload == {"from": job_id}
    assert chained[0].state is State.PENDING
    assert rig.store.executed == [Executed("INSERT INTO receipts (job_id) VALUES (%s)", (job_id,))]


@pytest.mark.parametrize("is_async", [False, True])
def test_chain_and_hooks_skipped_on_failure(rig: Rig, is_async: bool) -> None:
    called: list[Any] = []

    def body(claim: Claim) -> None:
        claim.chain(Job("next.step"))
        claim.on_succeeded(called.append)
        raise ValueError("after chaining")

    async def handler_async(claim: Claim) -> None:
        body(claim)

    rig.kind("a", handler_async if is_async else body, max_attempts=2)
    job_id = rig.enqueue("a")
    assert rig.run().outcome.kind is SettleKind.FAILED
    assert rig.row(job_id).state is State.FAILED
    assert [r.topic for r in rig.store.rows.values()] == ["a"]
    assert called == []
    assert rig.store.executed == []


@pytest.mark.parametrize(("max_attempts", "kind"), [(3, SettleKind.FAILED), (1, SettleKind.DEAD)])
def test_raising_hook_turns_the_attempt_into_a_failure(
    rig: Rig, max_attempts: int, kind: SettleKind
) -> None:
    def hook(conn: RecordingConnection) -> None:
        conn.execute("INSERT INTO must_not_survive DEFAULT VALUES")
        raise RuntimeError("ledger write failed")

    def handler(claim: Claim) -> None:
        claim.chain(Job("next.step"))
        claim.on_succeeded(hook)

    rig.kind("a", handler, max_attempts=max_attempts)
    job_id = rig.enqueue("a")
    attempted = rig.run()

    assert attempted.outcome.kind is kind  # reported as what was written, not "done"
    assert attempted.written
    assert rig.events.settled[-1].outcome.kind is kind
    row = rig.row(job_id)
    assert row.state is State(kind.value)
    assert row.last_error is not None and "ledger write failed" in row.last_error
    assert [r.topic for r in rig.store.rows.values()] == ["a"]  # the chained job rolled back
    assert rig.store.executed == []


def test_hook_raising_base_exception_rolls_back_the_chain(rig: Rig) -> None:
    def hook(conn: RecordingConnection) -> None:
        raise KeyboardInterrupt

    def handler(claim: Claim) -> None:
        claim.chain(Job("next.step"))
        claim.on_succeeded(hook)

    rig.kind("a", handler)
    job_id = rig.enqueue("a")
    with pytest.raises(KeyboardInterrupt):
        rig.run()
    assert [r.topic for r in rig.store.rows.values()] == ["a"]
    assert rig.row(job_id).state is State.PROCESSING  # nothing written; the reaper returns it


def test_claim_chain_and_on_succeeded_check_their_arguments(rig: Rig) -> None:
    errors: list[BaseException] = []

    def handler(claim: Claim) -> None:
        calls: list[Callable[[], None]] = [
            lambda: claim.chain({"topic": "x"}),  # type: ignore[arg-type]
            lambda: claim.on_succeeded("not callable"),  # type: ignore[arg-type]
        ]
        for call in calls:
            try:
                call()
            except TypeError as exc:
                errors.append(exc)

    rig.kind("a", handler)
    rig.enqueue("a")
    assert rig.run().outcome.kind is SettleKind.DONE
    assert len(errors) == 2


# --- the Queue facade -----------------------------------------------------------------------


def test_queue_over_the_in_memory_store_end_to_end() -> None:
    queue = brooq.Queue(PublicInMemoryStore())
    sent: list[str] = []

    @queue.kind("email.send", max_attempts=3)
    def send(claim: brooq.Claim) -> None:
        if claim.payload["to"] == "cancel@example.com":
            raise brooq.CancelJob("unsubscribed")
        if claim.payload["to"] == "later@example.com":
            raise brooq.Delay(60)
        sent.append(claim.payload["to"])

    @queue.kind("report-daily", max_attempts=1)
    async def report(claim: brooq.Claim) -> None:
        raise RuntimeError("no data")

    @queue.kind("flaky", max_attempts=3, backoff_base="10s", backoff_max="1m")
    def flaky(claim: brooq.Claim) -> None:
        raise ValueError("try again")

    assert callable(send) and send.__name__ == "send"  # the decorator returns the handler
    ids = {
        to: queue.enqueue(brooq.Job("email.send", {"to": to})).id
        for to in ("a@example.com", "b@example.com", "cancel@example.com", "later@example.com")
    }
    report_id = queue.enqueue(brooq.Job("report-daily", {})).id
    flaky_id = queue.enqueue(brooq.Job("flaky")).id
    dup = queue.enqueue(brooq.Job("email.send", {"to": "x"}, idempotency_key="order-42"))
    again = queue.enqueue(brooq.Job("email.send", {"to": "y"}, idempotency_key="order-42"))
    assert dup.created and not again.created and again.id == dup.id

    drained = queue.drain()

    assert isinstance(drained, brooq.Drained)
    assert drained.total == 7
    assert drained.outcomes == Counter(
        {"done": 3, "canceled": 1, "delayed": 1, "dead": 1, "failed": 1}
    )
    assert sorted(sent) == ["a@example.com", "b@example.com", "x"]
    assert queue.get(ids["a@example.com"]).state is State.DONE
    assert queue.get(ids["cancel@example.com"]).state is State.CANCELED
    assert queue.get(ids["later@example.com"]).state is State.FAILED
    assert queue.get(report_id).state is State.DEAD
    assert queue.get(flaky_id).state is State.FAILED
    assert queue.drain().total == 0  # retries are not ready yet


def test_queue_cancel_and_drain_topics() -> None:
    queue = brooq.Queue(PublicInMemoryStore())
    ran: list[str] = []
    queue.register("a", lambda claim: ran.append("a"))
    queue.register("b", lambda claim: ran.append("b"))
    a_id = queue.enqueue(brooq.Job("a")).id
    queue.enqueue(brooq.Job("b"))
    assert queue.cancel(a_id, reason="not needed")
    assert queue.get(a_id).state is State.CANCELED
    assert queue.drain(topics=["a"]).total == 0
    assert queue.drain(topics=["b"]).outcomes == Counter({"done": 1})
    assert ran == ["b"]
    assert not queue.cancel(a_id)  # already terminal


def test_queue_drain_stops_at_max_jobs() -> None:
    queue = brooq.Queue(PublicInMemoryStore())
    queue.register("a", lambda claim: None)
    queue.enqueue_many([brooq.Job("a") for _ in range(5)])
    assert queue.drain(max_jobs=2).total == 2
    assert queue.drain().total == 3


def test_queue_enqueue_rejects_bad_payload_and_writes_nothing() -> None:
    store = PublicInMemoryStore()
    queue = brooq.Queue(store)
    with pytest.raises(InvalidJob):
        queue.enqueue(brooq.Job("a", {"x": object()}))
    with pytest.raises(TypeError):
        queue.enqueue({"topic": "a"})  # type: ignore[arg-type]
    assert store.rows == {}


def test_queue_kind_options_are_checked_at_registration() -> None:
    queue = brooq.Queue(PublicInMemoryStore())
    with pytest.raises(InvalidKindOptions, match="max_attempts"):
        queue.kind("a", max_attempts=0)
    # above the default max_execution_timeout (5m): caught when filled with defaults
    with pytest.raises(InvalidKindOptions, match="max_execution_timeout"):
        queue.kind("a", attempt_timeout="10m")(lambda claim: None)
    queue.register("a", lambda claim: None)
    with pytest.raises(InvalidKindOptions, match="already"):
        queue.register("a", lambda claim: None)
    with pytest.raises(InvalidTopic):
        queue.register("Not A Topic", lambda claim: None)


def test_drain_applies_soft_timeouts_in_the_main_thread() -> None:
    queue = brooq.Queue(PublicInMemoryStore())
    queue.register(
        "slow", lambda claim: wait_for_interrupt(), attempt_timeout="100ms", max_attempts=1
    )
    queue.enqueue(brooq.Job("slow"))
    started = time.monotonic()
    assert queue.drain().outcomes == Counter({"dead": 1})
    assert time.monotonic() - started < 1.5


# --- KindOptions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": -3}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"attempt_timeout": timedelta(seconds=-1)}, "attempt_timeout"),
        ({"attempt_timeout": -5}, "attempt_timeout"),
        ({"attempt_timeout": "-5s"}, "attempt_timeout"),
        ({"attempt_timeout": 0}, "attempt_timeout"),
        ({"backoff_base": "10"}, "backoff_base"),
        ({"backoff_max": "1.5"}, "backoff_max"),
        ({"watchdog_grace": "soon"}, "watchdog_grace"),
        ({"max_execution_timeout": float("nan")}, "max_execution_timeout"),
        ({"max_execution_timeout": float("inf")}, "max_execution_timeout"),
        ({"attempt_timeout": 1e300}, "attempt_timeout"),
        ({"attempt_timeout": True}, "attempt_timeout"),
        ({"attempt_timeout": [1]}, "attempt_timeout"),
        ({"attempt_timeout": "2m", "max_execution_timeout": "1m"}, "max_execution_timeout"),
        ({"backoff_base": "2m", "backoff_max": "1m"}, "backoff_max"),
    ],
)
def test_kind_options_validation_names_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidKindOptions) as info:
        KindOptions(**options)
    message = str(info.value)
    assert field in message
    for name in options:
        assert name in message
    assert isinstance(info.value, ValueError)


def test_kind_options_list_every_problem_at_once() -> None:
    with pytest.raises(InvalidKindOptions) as info:
        KindOptions(max_attempts=0, attempt_timeout="10", backoff_max=-1)
    message = str(info.value)
    assert "max_attempts" in message
    assert "attempt_timeout" in message
    assert "backoff_max" in message


def test_kind_options_accept_durations_in_every_form() -> None:
    options = KindOptions(
        max_attempts=1,
        attempt_timeout="1m",
        max_execution_timeout=300,
        backoff_base=timedelta(seconds=2),
        backoff_max=2.5,
        watchdog_grace="1h30m",
    )
    assert options.attempt_timeout == timedelta(minutes=1)
    assert options.max_execution_timeout == timedelta(minutes=5)
    assert options.backoff_base == timedelta(seconds=2)
    assert options.backoff_max == timedelta(seconds=2.5)
    assert options.watchdog_grace == timedelta(hours=1, minutes=30)
    assert KindOptions(attempt_timeout="5m", max_execution_timeout="5m").attempt_timeout == (
        timedelta(minutes=5)
    )


# --- Topic ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic", ["email.send", "report-daily", "a1_b", "a", "x.y-z.w", "a" * TOPIC_MAX_LENGTH]
)
def test_valid_topics(topic: str) -> None:
    assert Topic(topic) == topic
    assert isinstance(Topic(topic), str)
    assert Job(topic).topic == topic


@pytest.mark.parametrize(
    "topic",
    [
        "",
        "Email",
        "a b",
        "a..b",
        ".a",
        "a.",
        "-a",
        "a--b",
        "x'; drop table job;--",
        "a" * 200,
        "a" * (TOPIC_MAX_LENGTH + 1),
        "émail",
        "email\n",
        "a/b",
        " a",
    ],
)
def test_invalid_topics(topic: str) -> None:
    with pytest.raises(InvalidTopic) as info:
        Topic(topic)
    assert str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidTopic):
        Job(topic)


def test_topic_must_be_a_string() -> None:
    with pytest.raises(InvalidTopic, match="string"):
        Topic(5)


def test_long_topic_message_is_shortened() -> None:
    with pytest.raises(InvalidTopic) as info:
        Topic("a" * 10_000)
    assert len(str(info.value)) < 200


# --- Job ------------------------------------------------------------------------------------


def test_job_key_at_the_limit_is_accepted_and_above_is_rejected() -> None:
    assert Job("a", idempotency_key="k" * IDEMPOTENCY_KEY_MAX_LENGTH).idempotency_key
    with pytest.raises(InvalidJob, match="idempotency_key"):
        Job("a", idempotency_key="k" * (IDEMPOTENCY_KEY_MAX_LENGTH + 1))
    with pytest.raises(InvalidJob, match="idempotency_key"):
        Job("a", idempotency_key="k" * 1_000_000)


def test_job_key_with_nul_is_rejected() -> None:
    with pytest.raises(InvalidJob, match="NUL"):
        Job("a", idempotency_key="ab\x00c")


def test_job_key_must_be_a_string() -> None:
    with pytest.raises(InvalidJob, match="string"):
        Job("a", idempotency_key=42)  # type: ignore[arg-type]


def test_job_empty_key_means_no_key_but_a_space_is_a_key() -> None:
    assert Job("a", idempotency_key="").idempotency_key is None
    assert Job("a", idempotency_key=None).idempotency_key is None
    assert Job("a", idempotency_key=" ").idempotency_key == " "


def test_job_naive_available_at_is_rejected() -> None:
    with pytest.raises(InvalidJob, match="timezone"):
        Job("a", available_at=datetime(2026, 1, 1))
    with pytest.raises(InvalidJob, match="datetime"):
        Job("a", available_at="2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    aware = datetime(2026, 1, 1, tzinfo=UTC)
    assert Job("a", available_at=aware).available_at == aware


def test_empty_keys_are_never_deduplicated(fake_store: InMemoryStore) -> None:
    results = fake_store.enqueue_many([Job("a", idempotency_key=""), Job("a", idempotency_key="")])
    assert all(r.created for r in results)
    assert results[0].id != results[1].id


# --- payloads -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (object(), ["not JSON-serializable", "object"]),
        ({"when": datetime(2026, 1, 1)}, ["not JSON-serializable", "datetime"]),
        ({1, 2}, ["not JSON-serializable", "set"]),
        (b"bytes", ["not JSON-serializable", "bytes"]),
        (float("nan"), ["not JSON-serializable", "NaN"]),
        ({"x": [float("inf")]}, ["not JSON-serializable", "Infinity"]),
        ("a\x00b", ["NUL"]),
        ({"k\x00": 1}, ["NUL"]),
        (["ok", {"deep": "\x00"}], ["NUL"]),
        ("\ud800", ["surrogate"]),
        ({"name": "x\udfffy"}, ["surrogate"]),
    ],
)
def test_bad_payloads_raise_invalid_job(payload: Any, words: list[str]) -> None:
    with pytest.raises(InvalidJob) as info:
        encode_payload(payload)
    for word in words:
        assert word in str(info.value)
    assert isinstance(info.value, ValueError)


def test_circular_payload_is_rejected() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidJob, match="Circular"):
        encode_payload(loop)


def test_deeply_nested_payload_is_rejected_not_a_recursion_error() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidJob, match="nested"):
        encode_payload(deep)


def test_payload_size_limit() -> None:
    assert encode_payload("x" * 100, max_bytes=102) == '"' + "x" * 100 + '"'
    with pytest.raises(InvalidJob, match="103 bytes") as info:
        encode_payload("x" * 101, max_bytes=102)
    assert "limit of 102" in str(info.value)
    with pytest.raises(InvalidJob, match="bytes"):
        encode_payload({"blob": "é" * DEFAULT_MAX_PAYLOAD_BYTES})  # 2 bytes a character


def test_payloads_that_are_fine() -> None:
    assert encode_payload(None) == "null"
    assert encode_payload({"a": [1, 2.5, True, None, "é", "\\u0000 is text"]}) == (
        '{"a":[1,2.5,true,null,"é","\\\\u0000 is text"]}'
    )
    assert encode_payload("😀") == '"😀"'


# --- durations ------------------------------------------------------------------------------

whole_ms = st.integers(
    min_value=timedelta.min // timedelta(milliseconds=1),
    max_value=timedelta.max // timedelta(milliseconds=1),
).map(lambda n: timedelta(milliseconds=n))


@given(whole_ms)
def test_format_then_parse_round_trips(value: timedelta) -> None:
    text = format_duration(value)
    assert parse_duration(text) == value


@given(st.integers(min_value=0, max_value=10**9).map(lambda n: timedelta(milliseconds=n)))
def test_parse_then_format_is_canonical(value: timedelta) -> None:
    text = format_duration(value)
    assert format_duration(parse_duration(text)) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("120s", timedelta(seconds=120)),
        ("2m", timedelta(minutes=2)),
        ("720h", timedelta(days=30)),
        ("1h30m", timedelta(minutes=90)),
        ("500ms", timedelta(milliseconds=500)),
        ("1.5s", timedelta(seconds=1.5)),
        ("2d", timedelta(days=2)),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
    ],
)
def test_parse_duration_examples(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["10", "1.5", "-3", "+7", "00", "3600"])
def test_bare_numbers_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="no unit"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["", " ", "s", "10 s", "1x", "1h 30m", "abc", "1e3s", "1,5s"])
def test_non_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_too_long_duration_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_duration("99999999999999999999h")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(minutes=2), "2m"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(days=30), "720h"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(seconds=1.5), "1s500ms"),
    ],
)
def test_format_duration_examples(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


# --- job ids --------------------------------------------------------------------------------


def test_new_job_id_is_strictly_increasing_uuid7() -> None:
    before_ms = time.time_ns() // 1_000_000
    ids = [new_job_id() for _ in range(10_000)]
    after_ms = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    assert all(a < b for a, b in itertools.pairwise(ids))
    parsed = [uuid.UUID(i) for i in ids]
    assert all(u.int < v.int for u, v in itertools.pairwise(parsed))
    for text, value in zip(ids, parsed, strict=True):
        assert str(value) == text  # canonical lowercase form
        assert value.version == 7
        assert value.variant == uuid.RFC_4122
    first_ms, last_ms = parsed[0].int >> 80, parsed[-1].int >> 80
    assert before_ms <= first_ms
    # the 12-bit counter may borrow a few milliseconds ahead when ids come faster
    assert last_ms <= after_ms + 10_000 // 0x1000 + 1


def test_new_job_id_is_increasing_across_threads() -> None:
    per_thread: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(new_job_id() for _ in range(2_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    every = [i for out in per_thread for i in out]
    assert len(set(every)) == 8_000
    for out in per_thread:
        assert out == sorted(out)
