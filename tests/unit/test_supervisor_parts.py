"""The supervisor's parts built from plain fakes: no Supervisor, no database, no fork.

Exits, HeldJobs, Registration and the reload steps each take the few
collaborators they use; here those are the in-memory store, a database
lane that runs tasks when told, recording callbacks and a settable clock.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import Counter

from brooq import metrics as prom
from brooq.engine.fake import InMemoryStore
from brooq.engine.kinds import Registry
from brooq.engine.outcome import DONE, SettleKind
from brooq.engine.store import Claimed
from brooq.supervisor.board import Board
from brooq.supervisor.child import ExitCode
from brooq.supervisor.children import ChildProcess, Exit, Interrupt, Kill, Running
from brooq.supervisor.completer import Completer, Pending
from brooq.supervisor.database import Done
from brooq.supervisor.dispatch import Dispatcher
from brooq.supervisor.exits import Exits
from brooq.supervisor.held import REPORT_GRACE_S, HeldJobs
from brooq.supervisor.leases import Held, Holdings
from brooq.supervisor.producer import Producer
from brooq.supervisor.registration import Registration
from brooq.supervisor.reload import LOAD_MIN_S, Loaded, Phase, Reloader, kept_settings
from brooq.supervisor.slots import SlotState
from brooq.vocabulary import Job, KindOptions, State

LEASE = timedelta(seconds=30)
HOLDER = "host:1:abc"
GROUP = ("a",)
OPTIONS = KindOptions(
    max_attempts=2, backoff_base=timedelta(seconds=1), backoff_max=timedelta(seconds=10)
)


class Lane:
    """A database lane whose tasks wait until :meth:`finish`."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, Callable[[], Any], Done]] = []

    def submit(self, name: str, run: Callable[[], Any], done: Done) -> None:
        self.tasks.append((name, run, done))

    def busy(self, name: str) -> bool:
        return any(n == name for n, _, _ in self.tasks)

    def idle(self) -> bool:
        return not self.tasks

    def names(self) -> list[str]:
        return [n for n, _, _ in self.tasks]

    def finish(self) -> None:
        tasks, self.tasks = self.tasks, []
        for _, run, done in tasks:
            done(run(), None)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def count(counter: Counter, **labels: str) -> float:
    """The value of one series of ``counter`` (0 when it was never touched)."""
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels == labels:
                return float(sample.value)
    return 0.0


class Rig:
    """The collaborators the parts are built from, all in memory."""

    def __init__(self) -> None:
        self.store = InMemoryStore()
        self.claims, self.writes = Lane(), Lane()
        self.clock = Clock()
        self.holdings = Holdings()
        self.metrics = prom.Metrics(registry=None)
        self.producer = Producer(
            self.store,
            self.claims,
            HOLDER,
            LEASE,
            [GROUP],
            {},
            prefetch=0,
            poll_interval=timedelta(seconds=1),
            max_wait=5.0,
            on_claimed=lambda claimed, end: None,
        )
        self.flushed: list[tuple[list[Pending], list[Pending]]] = []
        self.completer = Completer(
            self.store, self.writes, lambda ok, lost: self.flushed.append((ok, lost))
        )
        self.released: list[tuple[list[str], str]] = []
        self.restarts: list[Exit] = []
        self.interrupted: list[tuple[int, Interrupt]] = []
        self.killed: list[tuple[int, Kill]] = []
        self.running: dict[str, ChildProcess] = {}

    def claim(self, n: int = 1) -> list[Claimed]:
        self.store.enqueue_many([Job("a", {"i": i}) for i in range(n)])
        return self.store.claim_many(HOLDER, ["a"], LEASE, n)

    def exits(self) -> Exits:
        return Exits(
            options=lambda claimed: OPTIONS,
            completer=self.completer,
            producer=self.producer,
            holdings=self.holdings,
            release=lambda claimed, why: self.released.append(([c.id for c in claimed], why)),
            restarted=self.restarts.append,
            lease_s=LEASE.total_seconds(),
            clock=self.clock,
        )

    def held(self) -> HeldJobs:
        return HeldJobs(
            holdings=self.holdings,
            metrics=self.metrics,
            writes=self.writes,
            store=self.store,
            withdraw=self.producer.drop,
            running=self.running.get,
            interrupt=lambda child, why, note: self.interrupted.append((child.pid, why)),
            kill=lambda child, why: self.killed.append((child.pid, why)),
            clock=self.clock,
        )


def child_with(claimed: Claimed | None, *, pid: int = 7, started: float = 0.0) -> ChildProcess:
    child = ChildProcess(
        slot=0,
        pid=pid,
        group=GROUP,
        sock=-1,
        started=started,
        generation=0,
        metrics_id="w0",
        booted=True,
    )
    if claimed is not None:
        child.queue.append(Running(claimed, 1, started, 5.0, started=started))
    return child


KILLED = signal.SIGKILL.value  # the wait status of "killed by SIGKILL"
EXITED_IDLE = 6 << 8  # exit code 6: SIGTERM while waiting, the job never started
EXITED_AT_LEASE_END = ExitCode.LEASE_ENDING << 8


# --- Exits -------------------------------------------------------------------------------------


def test_a_worker_that_dies_mid_job_records_a_failure_and_counts_a_crash() -> None:
    rig = Rig()
    (claimed,) = rig.claim()
    rig.holdings.add(claimed.ticket, "a", 130.0)
    slot = SlotState(["a"])
    reason = rig.exits().worker_exited(
        child_with(claimed), KILLED, generation=0, stopping=False, slot=slot
    )
    assert reason is Exit.CRASH and rig.restarts == [Exit.CRASH]
    (pending,) = rig.completer.pending
    assert pending.ticket == claimed.ticket and pending.outcome.kind is SettleKind.FAILED
    assert "killed by SIGKILL" in (pending.outcome.error or "")
    assert slot.not_before == 0.0  # a job to blame: no backoff for the slot


def test_a_job_the_worker_never_started_goes_back_into_the_buffer() -> None:
    rig = Rig()
    (claimed,) = rig.claim()
    rig.exits().worker_exited(
        child_with(claimed), EXITED_IDLE, generation=0, stopping=False, slot=SlotState(["a"])
    )
    assert rig.producer.take(GROUP) == claimed
    assert not rig.completer.pending and not rig.released


def test_while_stopping_an_unstarted_job_is_released_not_put_back() -> None:
    rig = Rig()
    (claimed,) = rig.claim()
    rig.exits().worker_exited(
        child_with(claimed), EXITED_IDLE, generation=0, stopping=True, slot=None
    )
    assert rig.released == [([claimed.id], "stopping")]
    assert rig.producer.take(GROUP) is None


def test_a_shutdown_kill_releases_and_a_lost_lease_writes_nothing() -> None:
    rig = Rig()
    first, second = rig.claim(2)
    killed = child_with(first)
    killed.kill = Kill.SHUTDOWN
    rig.exits().worker_exited(killed, KILLED, generation=0, stopping=True, slot=None)
    assert rig.released == [([first.id], "shutdown")]
    rig.holdings.add(second.ticket, "a", 130.0)
    lost = child_with(second, pid=8)
    assert lost.job is not None
    lost.job.interrupted = Interrupt.LEASE_LOST
    rig.exits().worker_exited(lost, KILLED, generation=0, stopping=False, slot=None)
    assert second.id not in rig.holdings and not rig.completer.pending


def test_a_worker_that_left_as_its_lease_ended_leaves_the_job_to_the_reaper() -> None:
    rig = Rig()
    first, second = rig.claim(2)
    rig.holdings.add(first.ticket, "a", 103.0)
    child = child_with(first)
    child.post_lease(103.0)  # 3 s left at 100: within the worker's margin (lease/6 = 5 s)
    reason = rig.exits().worker_exited(
        child, EXITED_AT_LEASE_END, generation=0, stopping=False, slot=SlotState(["a"])
    )
    assert reason is Exit.LEASE_ENDING and rig.restarts == [Exit.LEASE_ENDING]
    assert first.id not in rig.holdings and not rig.completer.pending and not rig.released
    # The same exit code while the lease is far from its end is a handler's own: a crash.
    rig.holdings.add(second.ticket, "a", 130.0)
    early = child_with(second, pid=8)
    early.post_lease(130.0)
    reason = rig.exits().worker_exited(
        early, EXITED_AT_LEASE_END, generation=0, stopping=False, slot=SlotState(["a"])
    )
    assert reason is Exit.CRASH
    (pending,) = rig.completer.pending
    assert pending.ticket == second.ticket and pending.outcome.kind is SettleKind.FAILED


def test_a_worker_that_dies_at_boot_backs_its_slot_off() -> None:
    rig = Rig()
    slot = SlotState(["a"])
    child = child_with(None, started=99.0)
    child.booted = False
    reason = rig.exits().worker_exited(child, 1 << 8, generation=0, stopping=False, slot=slot)
    assert reason is Exit.CRASH
    assert slot.failures == 1 and slot.not_before == rig.clock.now + 0.5


# --- Dispatcher: the lease a worker is told -----------------------------------------------------


def test_each_worker_is_told_the_earliest_lease_end_of_the_jobs_it_holds() -> None:
    rig = Rig()
    first, second = rig.claim(2)
    rig.holdings.add(first.ticket, "a", 130.0)
    rig.holdings.add(second.ticket, "a", 125.0)
    child = child_with(None)
    child.board = board = Board()
    dispatcher = Dispatcher(
        Registry(),
        rig.producer,
        rig.completer,
        rig.holdings,
        rig.metrics,
        5.0,
        workers=lambda: [child],
    )
    rig.producer.put_back(GROUP, first, 100.0)
    assert dispatcher.top_up(child, 100.0) == 1  # a topic not measured yet: one job at a time
    assert child.lease_until == board.lease_until() == 130.0  # posted before the job goes out
    rig.holdings.extend([first.id], 150.0)  # a heartbeat got through
    dispatcher.post_leases()
    assert board.lease_until() == 150.0
    child.queue.append(Running(second, 2, 100.0, 5.0))
    dispatcher.post_leases()
    assert board.lease_until() == 125.0  # the earliest end of what the worker holds
    rig.holdings.drop(first.id)
    rig.holdings.drop(second.id)  # lost: the end last posted stands
    dispatcher.post_leases()
    assert board.lease_until() == 125.0
    board.close()


# --- HeldJobs ----------------------------------------------------------------------------------


def test_claims_are_held_and_counted_and_flushes_counted_by_outcome() -> None:
    rig = Rig()
    held = rig.held()
    first, second = rig.claim(2)
    held.claimed([first, second], 130.0)
    assert first.id in rig.holdings and second.id in rig.holdings
    assert count(rig.metrics.claimed, topic="a") == 2
    ok = Pending(first.ticket, DONE, "a", 1.0)
    lost = Pending(second.ticket, DONE, "a", 1.0)
    held.flushed([ok], [lost])
    assert len(rig.holdings) == 0
    assert count(rig.metrics.settled, topic="a", outcome="done") == 1
    assert count(rig.metrics.lease_lost, topic="a") == 1


def test_a_lost_job_in_the_buffer_is_dropped_and_a_running_one_interrupted_after_grace() -> None:
    rig = Rig()
    held = rig.held()
    buffered, running = rig.claim(2)
    rig.producer.put_back(GROUP, buffered, 0.0)
    held.lost(Held(buffered.ticket, "a", 130.0))
    assert rig.producer.take(GROUP) is None and not held.suspects
    child = child_with(running)
    rig.running[running.id] = child
    held.lost(Held(running.ticket, "a", 130.0))
    held.confirm_lost(rig.clock.now)  # its report may still come: wait
    assert rig.interrupted == []
    held.confirm_lost(rig.clock.now + REPORT_GRACE_S)
    assert rig.interrupted == [(child.pid, Interrupt.LEASE_LOST)]


def test_a_cancel_interrupts_the_running_handler() -> None:
    rig = Rig()
    held = rig.held()
    (claimed,) = rig.claim()
    rig.running[claimed.id] = child_with(claimed)
    held.canceled(claimed.id)
    assert rig.interrupted == [(7, Interrupt.CANCELED)]


def test_failing_heartbeats_interrupt_then_kill_before_the_lease_ends() -> None:
    rig = Rig()
    held = rig.held()
    (claimed,) = rig.claim()
    rig.running[claimed.id] = child_with(claimed)
    held.expiring([Held(claimed.ticket, "a", 110.0)], 100.0, lease_s=30.0)
    assert rig.interrupted == [(7, Interrupt.LEASE_LOST)] and rig.killed == []
    held.expiring([Held(claimed.ticket, "a", 110.0)], 109.5, lease_s=30.0)
    assert rig.killed == [(7, Kill.LEASE_ENDING)]


def test_release_gives_jobs_back_uncharged_on_the_writes_lane() -> None:
    rig = Rig()
    held = rig.held()
    (claimed,) = rig.claim()
    rig.holdings.add(claimed.ticket, "a", 130.0)
    held.release([claimed], "stopping")
    assert claimed.id not in rig.holdings and rig.writes.names() == ["release"]
    rig.writes.finish()
    row = rig.store.get(claimed.id)
    assert row.state is State.PENDING and row.attempts == 0


# --- Registration ------------------------------------------------------------------------------


class Writer:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def register(self, **row: Any) -> None:
        self.rows[row["holder"]] = row

    def unregister(self, holder: str) -> None:
        self.rows.pop(holder, None)


def test_registration_writes_what_each_worker_runs_when_due_then_leaves_at_a_clean_stop() -> None:
    writer, lane = Writer(), Lane()
    registration = Registration(writer, lane, holder=HOLDER, app="app:q", wall_clock=lambda: 1e9)
    (claimed,) = Rig().claim()
    busy, idle = child_with(claimed, started=95.0), child_with(None, pid=8)
    idle.slot = 1
    assert registration.run_once(100.0, workers=[idle, busy], topics=["a"], stopping=False)
    lane.finish()
    row = writer.rows[HOLDER]
    assert [(w["pid"], w["job_id"]) for w in row["workers"]] == [(7, claimed.id), (8, None)]
    started = datetime.fromisoformat(row["workers"][0]["started_at"])
    assert started == datetime.fromtimestamp(1e9 - 5.0, UTC)
    assert registration.run_once(101.0, workers=[busy], topics=["a"], stopping=False) is None
    assert registration.run_once(101.0, workers=[busy], topics=["a"], stopping=True) is None
    assert registration.run_once(102.0, workers=[], topics=["a"], stopping=True) == "unregister"
    lane.finish()
    assert writer.rows == {}
    assert registration.run_once(103.0, workers=[], topics=["a"], stopping=True) is None


# --- reload steps --------------------------------------------------------------------------------


class FakeCheck:
    def __init__(self, verdict: str | None = None) -> None:
        self.answer = verdict
        self.stopped = False

    def verdict(self) -> str | None:
        return self.answer

    def stop(self) -> None:
        self.stopped = True


class FakeLoader:
    spec = "app:queue"

    def __init__(self, result: Callable[[], Any]) -> None:
        self.result, self.put_back_calls = result, 0

    def load_again(self) -> Any:
        return self.result()

    def put_back(self) -> None:
        self.put_back_calls += 1


def reloader_with(loader: FakeLoader, checks: list[FakeCheck]) -> Reloader:
    settings = object()
    return Reloader(
        loader,  # type: ignore[arg-type]
        settings=lambda: settings,  # type: ignore[arg-type,return-value]
        prepare=lambda queue, s: [["a"], ["a"]],
        configured=[["a"]],
        start_check=lambda spec: checks.pop(0),
    )


def settle(reloader: Reloader, now: float, rolled: Any = None) -> Loaded | None:
    """Step until the load thread answers (it runs in a thread of its own)."""
    import time

    for _ in range(200):
        loaded = reloader.step(now, stopping=False, rolled=lambda: rolled, cleanup=lambda: None)
        if loaded is not None or reloader.phase is not Phase.LOADING:
            return loaded
        time.sleep(0.01)
    raise AssertionError("the load never finished")


def test_a_reload_checks_then_loads_then_rolls() -> None:
    check = FakeCheck()
    reloader = reloader_with(FakeLoader(lambda: "new queue"), [check])
    reloader.begin(0.0)
    assert reloader.phase is Phase.CHECKING
    assert reloader.step(1.0, stopping=False, rolled=lambda: None, cleanup=lambda: None) is None
    check.answer = ""  # passed
    loaded = settle(reloader, 2.0)
    assert loaded is not None and check.stopped
    assert loaded.queue == "new queue"  # type: ignore[comparison-overlap]
    assert str(reloader.phase) == "rolling" and reloader.new_slots(loaded) == [["a"], ["a"]]
    assert reloader.new_slots(loaded) is None  # the same slots again: TTIN/TTOU stand
    settle(reloader, 3.0, rolled=(2, 1))
    assert not reloader.rolling


def test_a_failed_check_or_a_failing_import_keeps_the_old_code() -> None:
    reloader = reloader_with(FakeLoader(lambda: "unused"), [FakeCheck("SyntaxError: bad")])
    reloader.begin(0.0)
    assert settle(reloader, 1.0) is None and reloader.phase is Phase.IDLE

    def exits() -> Any:
        raise SystemExit(3)

    reloader = reloader_with(FakeLoader(exits), [FakeCheck("")])
    reloader.begin(0.0)
    assert settle(reloader, 1.0) is None and reloader.phase is Phase.IDLE


def test_an_import_over_its_bound_is_abandoned_and_undone() -> None:
    import threading

    release = threading.Event()
    loader = FakeLoader(lambda: release.wait(5) and "late queue")
    reloader = reloader_with(loader, [FakeCheck("")])
    reloader.begin(0.0)
    reloader.step(0.1, stopping=False, rolled=lambda: None, cleanup=lambda: None)
    assert reloader.loading  # the loop goes on; forks wait
    done = reloader.step(
        0.1 + LOAD_MIN_S + 1, stopping=False, rolled=lambda: None, cleanup=lambda: None
    )
    assert done is None and reloader.phase is Phase.IDLE and loader.put_back_calls == 1
    release.set()  # the import finishes late: its result is undone, never used
    for _ in range(100):
        if loader.put_back_calls == 2:
            break
        threading.Event().wait(0.01)
    assert loader.put_back_calls == 2


def test_kept_settings_keeps_what_needs_a_restart() -> None:
    from brooq.config import load_settings

    old = load_settings(environ={"QUEUE_LEASE": "2m", "QUEUE_WORKERS": "2"}, env_file=None)
    new = load_settings(environ={"QUEUE_LEASE": "5m", "QUEUE_WORKERS": "4"}, env_file=None)
    kept, unapplied = kept_settings(old, new)
    assert kept.lease == old.lease and kept.workers == new.workers
    assert unapplied == ["lease", "reaper_period"]  # the reaper period follows the lease


def test_a_revoked_grant_is_said_once_and_the_supervisor_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from brooq.vocabulary import PrivilegeMissing

    class Revoked(Writer):
        def register(self, **row: Any) -> None:
            raise PrivilegeMissing("permission denied for table brooq_supervisor")

    lane = Lane()
    registration = Registration(Revoked(), lane, holder=HOLDER, app="app:q")
    for now in (100.0, 106.0, 112.0):
        registration.run_once(now, workers=[], topics=["a"], stopping=False)
        lane.finish()
    warned = [r for r in caplog.records if r.getMessage() == "RegistrationFailed"]
    assert len(warned) == 1
