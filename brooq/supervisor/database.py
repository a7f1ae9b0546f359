"""The parent's database work, off its loop: one thread, one connection, tasks in order.

The loop submits small tasks (claim, flush outcomes, heartbeat, release, a
reaper or retention batch) and goes on serving its workers and signals; a
task's ``done`` callback runs back in the loop when it finishes. A task that
does not return within ``stuck_after`` (a stopped backend, a silent network)
gets its connection cut, so the thread moves on with a new one: no statement
can stall the loop, and none can hold the next ones forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from brooq.logs import event
from brooq.osproc import no_fork
from brooq.postgres.connect import Connector
from brooq.vocabulary import StoreUnavailable

log = logging.getLogger("brooq.supervisor")
PROBE_EVERY_S = 2.0
"""A quiet database gets a cheap query this often, so its health is never long unknown."""
OUTAGE_LOG_S = 60.0
"""While the database stays unavailable for the same reason, log it again this often."""

Done = Callable[[Any, BaseException | None], None]
"""Called in the loop with the task's result, or with the exception it raised."""


@dataclass
class Task:
    """One unit of database work and what to do with its result."""

    name: str
    run: Callable[[], Any]
    done: Done
    result: Any = None
    error: BaseException | None = None
    started: float = 0.0


class Database(Protocol):
    """Where the supervisor's services send their database work."""

    def submit(self, name: str, run: Callable[[], Any], done: Done) -> None:
        """Queue ``run``; ``done`` gets its result in the loop."""

    def busy(self, name: str) -> bool:
        """True while a task called ``name`` is queued or running."""

    def idle(self) -> bool:
        """True when no task is queued or running."""


@dataclass
class DatabaseThread:
    """Runs tasks in submission order on a daemon thread; results come back through a pipe."""

    connector: Connector
    stuck_after: float
    _todo: queue.SimpleQueue[Task | None] = field(default_factory=queue.SimpleQueue)
    _finished: queue.SimpleQueue[Task] = field(default_factory=queue.SimpleQueue)
    _names: Counter[str] = field(default_factory=Counter)
    _current: Task | None = None
    _aborted: Task | None = None
    last_ok: float = 0.0
    """``time.monotonic()`` of the last task that finished without an outage."""
    last_failed: float = 0.0
    """``time.monotonic()`` of the last task that met an outage."""

    def __post_init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self._thread = threading.Thread(target=self._serve, name="brooq-db", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        """Readable when finished tasks wait for :meth:`collect`."""
        return self._read

    def submit(self, name: str, run: Callable[[], Any], done: Done) -> None:
        """Queue ``run``; ``done`` gets its result in the loop (see :meth:`collect`)."""
        self._names[name] += 1
        self._todo.put(Task(name, run, done))

    def busy(self, name: str) -> bool:
        """True while a task called ``name`` is queued or running."""
        return self._names[name] > 0

    def idle(self) -> bool:
        """True when no task is queued or running."""
        return not +self._names

    def collect(self) -> int:
        """Call the ``done`` of every finished task, in the loop's thread; how many."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass
        count = 0
        while True:
            try:
                task = self._finished.get_nowait()
            except queue.Empty:
                return count
            self._names[task.name] -= 1
            count += 1
            task.done(task.result, task.error)

    def check_stuck(self, now: float) -> bool:
        """Cut the connection under a task running longer than ``stuck_after``; True if cut."""
        task = self._current
        if task is None or task is self._aborted or now - task.started < self.stuck_after:
            return False
        self._aborted = task
        event(
            log,
            "DatabaseStuck",
            logging.WARNING,
            task=task.name,
            seconds=round(now - task.started, 1),
            note="cutting the connection; the next task opens a new one",
        )
        self.connector.abort()
        return True

    def stop(self, timeout: float) -> None:
        """Finish the queued tasks (at most ``timeout`` s), then end the thread."""
        self._todo.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.connector.abort()
            self._thread.join(1.0)
        self.collect()
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)

    _reported: tuple[str, float] | None = None

    def _report_outage(self, task: str, exc: StoreUnavailable) -> None:
        """Log why the database is unavailable (its text is password-free): /healthz only
        says "database unavailable". Once per new reason, and at most every OUTAGE_LOG_S."""
        text, now = str(exc), time.monotonic()
        last = self._reported
        if last is not None and last[0] == text and now - last[1] < OUTAGE_LOG_S:
            return
        self._reported = (text, now)
        event(log, "DatabaseUnavailable", logging.WARNING, task=task, error=text)

    def _serve(self) -> None:
        while (task := self._todo.get()) is not None:
            task.started = time.monotonic()
            self._current = task
            try:
                with no_fork():
                    task.result = task.run()
                self.last_ok = time.monotonic()
                self._reported = None
            except StoreUnavailable as exc:
                task.error = exc
                self.last_failed = time.monotonic()
                self._report_outage(task.name, exc)
            except BaseException as exc:  # a bug in a task must not end the thread
                task.error = exc
                log.error("database task failed", exc_info=exc, extra={"task": task.name})
            self._current = None
            self._finished.put(task)
            with contextlib.suppress(OSError):
                os.write(self._write, b".")


class InlineDatabase:
    """Runs each task at once in the caller's thread (unit tests of the services)."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def submit(self, name: str, run: Callable[[], Any], done: Done) -> None:
        """Run ``run`` now and hand its result to ``done``."""
        self.ran.append(name)
        try:
            result = run()
        except BaseException as exc:
            done(None, exc)
            return
        done(result, None)

    def busy(self, name: str) -> bool:
        """Never: every task finished when it was submitted."""
        return False

    def idle(self) -> bool:
        """Always."""
        return True


class Lanes:
    """The supervisor's two database threads, each with its own connection.

    ``claims`` serves the producer and the heartbeat, so that a claim or a
    lease never waits behind a batch of outcomes or a retention pass;
    ``writes`` serves the completer, releases and maintenance. The two run
    at once, so one commit's flush to disk overlaps the other's.
    """

    def __init__(self, claims: DatabaseThread, writes: DatabaseThread) -> None:
        self.claims, self.writes = claims, writes
        self.all = (claims, writes)

    def filenos(self) -> list[int]:
        """Readable when finished tasks wait for :meth:`collect`."""
        return [lane.fileno() for lane in self.all]

    def collect(self, readable: set[int] | None = None) -> None:
        """Hand every finished task's result to its ``done``, in the loop (only the lanes in
        ``readable``, when given: the others have nothing finished)."""
        for lane in self.all:
            if readable is None or lane.fileno() in readable:
                lane.collect()

    def check_stuck(self, now: float) -> None:
        """Cut the connection of a lane whose task runs too long."""
        for lane in self.all:
            lane.check_stuck(now)

    def idle(self) -> bool:
        """True when neither lane has work queued or running."""
        return all(lane.idle() for lane in self.all)

    @property
    def last_ok(self) -> float:
        """When a task of either lane last finished without an outage."""
        return max(lane.last_ok for lane in self.all)

    @property
    def last_failed(self) -> float:
        """When a task of either lane last met an outage."""
        return max(lane.last_failed for lane in self.all)

    @property
    def last_heard(self) -> float:
        """When a task of either lane last finished, with or without an outage."""
        return max(self.last_ok, self.last_failed)

    def probe(self, now: float, ping: Callable[[], object], *, asked: bool) -> bool:
        """Send ``ping`` down the writes lane when the lanes were quiet for PROBE_EVERY_S, or
        when ``asked`` (a fresh answer is wanted); True if sent."""
        if not (asked or now - self.last_heard >= PROBE_EVERY_S) or self.writes.busy("ping"):
            return False
        self.writes.submit("ping", ping, lambda result, error: None)
        return True

    def answering(self, now: float, silent_s: float) -> bool:
        """True when the latest task met no outage and one finished within ``silent_s``."""
        return self.last_ok > self.last_failed and now - self.last_ok < silent_s

    def stop(self, timeout: float) -> None:
        """Finish the queued tasks of both lanes (at most ``timeout`` s each), then end them."""
        for lane in self.all:
            lane.stop(timeout)
