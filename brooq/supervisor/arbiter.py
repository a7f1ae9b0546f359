"""The supervisor loop, in the style of gunicorn's arbiter.

Signal handlers only queue the signal (and wake the loop through the wakeup
fd). One loop waits on the wakeup pipe, the workers' sockets, the database
thread and the LISTEN thread, then runs small named steps. Every tick brings
the workers back to the target, so a lost signal costs nothing. The loop
itself never waits for the database: its services (producer, completer,
heartbeat, maintenance) hand their statements to the database thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as stdqueue
import select
import signal
import time
from enum import StrEnum
from types import FrameType

from brooq import metrics as prom
from brooq import osproc
from brooq.config import Settings
from brooq.logs import event
from brooq.postgres.inspection import PostgresInspection
from brooq.queue import Queue
from brooq.supervisor import protocol, reload, services
from brooq.supervisor.children import RESTART_REASONS, ChildProcess, Kill
from brooq.supervisor.completer import Completer
from brooq.supervisor.database import DatabaseThread, Lanes
from brooq.supervisor.exits import Exits
from brooq.supervisor.held import HeldJobs
from brooq.supervisor.leases import Holdings, LeaseKeeper
from brooq.supervisor.notices import Notices
from brooq.supervisor.processes import Processes
from brooq.supervisor.registration import Registration
from brooq.supervisor.slots import SlotState
from brooq.supervisor.surface import Surface
from brooq.supervisor.systemd import Notifier
from brooq.vocabulary import format_duration, holder_id

log = logging.getLogger("brooq.supervisor")

HANDLED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGCHLD,
)
MAX_TICK_S = 1.0
BUSY_TICK_S = 0.1
FINAL_FLUSH_S = 10.0
PROBE_EVERY_S = 2.0


class Stopping(StrEnum):
    """How the supervisor is stopping."""

    GRACEFUL = "graceful"
    FAST = "fast"


class Supervisor:
    """Forks and supervises the worker processes of one app; claims and settles for them."""

    def __init__(
        self,
        queue: Queue,
        settings: Settings,
        slots: list[list[str]],
        dsn: str,
        name: str = "app",
        metrics: prom.Metrics | None = None,
        reloader: reload.Reloader | None = None,
    ) -> None:
        self.queue, self.settings, self.dsn, self.name = queue, settings, dsn, name
        self.metrics = metrics or prom.Metrics()
        self.holder = holder_id()
        self.pid = os.getpid()
        self.slots = [SlotState(sorted(t)) for t in slots]
        self.workers = Processes(
            queue, settings, dsn, self.metrics, self.pid, self.parent_fds, HANDLED_SIGNALS
        )
        self.children = self.workers.children
        self.exits = Exits(self)
        self.held = HeldJobs(self)
        self.release = self.held.release
        self.signals: stdqueue.SimpleQueue[int] = stdqueue.SimpleQueue()
        self.notifier = Notifier()
        self.generation = 0
        self.stopping: Stopping | None = None
        self.stop_deadline = 0.0
        self.store, self.claims_store = services.open_stores(settings, dsn)
        self.holdings = Holdings()
        self.surface: Surface | None = None
        self.readable: set[int] = set()
        """The descriptors the last wait found readable."""
        self.reloader = reloader

    # --- lifecycle ------------------------------------------------------------------

    def run(self) -> int:
        """Serve until stopped by a signal; the exit code (0 after a clean stop)."""
        self.setup()
        try:
            while not self.finished():
                self.handle_signals()
                self.wait()
                self.tick()
        finally:
            self.teardown()
        event(log, "SupervisorExited", restarts=self.exits.restarts)
        return 0

    def setup(self) -> None:
        """Self-pipe, signal handlers, threads, services, process title."""
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        prom.set_identity("supervisor")
        topics = self.queue.registry.topics()
        self.metrics.initialise(
            topics, [str(r) for r in RESTART_REASONS], [s.name for s in self.queue.schedules]
        )
        self.surface = Surface.open(self)
        osproc.become_subreaper()
        signal.set_wakeup_fd(self.wake_w)
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, self._queue_signal)
        self.start_services()
        if self.surface is not None:
            self.surface.start()
        osproc.title(f"brooq supervisor {self.name} workers={len(self.slots)}")
        event(
            log,
            "SupervisorStarted",
            workers=len(self.slots),
            pid=self.pid,
            holder=self.holder,
            http=self.surface.address if self.surface else "off",
        )

    def start_services(self) -> None:
        """The database and LISTEN threads, and the services that use them."""
        s = self.settings
        stuck_after = max(2.0, s.lease.total_seconds() / 6)
        self.db = Lanes(
            DatabaseThread(self.claims_store.connector, stuck_after),
            DatabaseThread(self.store.connector, stuck_after),
        )
        self.inspection = PostgresInspection(self.store.connector)
        self.notices = Notices(s.listen_dsn(self.dsn), s.poll_interval)
        self.producer = services.producer_for(self)
        self.completer = Completer(self.store, self.db.writes, self.held.flushed)
        self.leases = LeaseKeeper(
            self.claims_store, self.db.claims, self.holdings, s.lease, self.held.lost
        )
        self.dispatcher = services.dispatcher_for(self)
        self.maintenance = services.maintenance_for(self)
        self.registration = Registration(self)  # brooq_supervisor row: `brooq workers`

    def _queue_signal(self, signum: int, frame: FrameType | None) -> None:
        """NO LOGGING, just queue the signal; the wakeup fd wakes the loop."""
        self.signals.put(signum)

    def finished(self) -> bool:
        """True once stopping is complete: no workers, nothing left to write (or too late)."""
        if not self.stopping or self.children:
            return False
        if self.final_deadline == 0.0:
            self.final_deadline = time.monotonic() + FINAL_FLUSH_S
        settled = not self.completer.pending and self.db.idle()
        return settled or time.monotonic() >= self.final_deadline

    final_deadline = 0.0

    def teardown(self) -> None:
        """Let the database thread finish its queue, then close what the parent opened."""
        signal.set_wakeup_fd(-1)
        osproc.kill_children()  # what handlers left behind, reparented to us: nothing outlives
        self.db.stop(timeout=5.0)
        self.notices.stop()
        self.store.close()
        self.claims_store.close()
        if self.surface is not None:
            self.surface.close()
        for fd in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- the loop ---------------------------------------------------------------------

    def tick(self) -> None:
        """One pass of every step."""
        now = time.monotonic()
        self.notifier.pet()
        self.db.collect()
        self.read_notices()
        self.read_workers(self.readable)
        self.readable = set()
        self.reap_children()
        self.kill_hung(now)
        self.workers.kill_broken(now)
        self.keep_leases(now)
        self.release_stale(now)
        self.dispatcher.run_once(self.children.values(), now)
        if not self.stopping:
            self.producer.run_once(now, *self.workers.group_counts())
            self.maintenance.run_once(now)
        self.completer.run_once(now, force=bool(self.stopping))
        if self.stopping:
            self.release(self.producer.drain(), "stopping")  # claims that came back late
        self.probe_database(now)
        reload.step(self, now)
        self.manage_workers()
        self.db.check_stuck(now)
        self.report_ready()
        self.registration.run_once(now)
        if self.surface is not None:
            self.surface.publish(self)

    def wait(self) -> None:
        """Sleep until a signal, a worker's message, a database result, a NOTIFY or a deadline."""
        socks, writes = self.workers.sockets()
        reads = [self.wake_r, *self.db.filenos(), self.notices.fileno(), *socks]
        try:
            ready, writable, _ = select.select(reads, writes, [], self.timeout())
        except InterruptedError:
            return
        self.readable = set(ready)
        for child in self.children.values():
            if child.sock in writable:
                child.flush()
        if self.wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.wake_r, 4096):
                    pass

    def timeout(self) -> float:
        """Seconds until the next thing that must happen, at most MAX_TICK_S."""
        now = time.monotonic()
        cap = BUSY_TICK_S if (self.holdings or self.stopping) else MAX_TICK_S
        deadlines = [self.leases.every.next_at]
        if self.notifier.next_pet_at is not None:
            deadlines.append(self.notifier.next_pet_at)
        if (flush_at := self.completer.next_flush_at()) is not None:
            deadlines.append(flush_at)
        deadlines += [d for c in self.children.values() if c.job and (d := c.job.next_deadline())]
        return max(0.0, min([cap] + [d - now for d in deadlines]))

    # --- signals --------------------------------------------------------------------------

    def handle_signals(self) -> None:
        """Dispatch queued signals to ``handle_<name>``."""
        while True:
            try:
                signum = self.signals.get_nowait()
            except stdqueue.Empty:
                return
            name = signal.Signals(signum).name.lower()
            getattr(self, f"handle_{name}", lambda: None)()

    def handle_sigterm(self) -> None:
        """Graceful stop: no more claims; running jobs get the graceful timeout."""
        if self.stopping:
            self.handle_sigquit()
            return
        self.stopping = Stopping.GRACEFUL
        self.notifier.stopping("stopping: running jobs finish")
        self.stop_deadline = time.monotonic() + self.settings.graceful_timeout.total_seconds()
        event(
            log,
            "SupervisorStopping",
            mode="graceful",
            timeout=format_duration(self.settings.graceful_timeout),
        )
        self.release(self.producer.drain(), "stopping")
        for child in self.workers:
            self.workers.retire(child)

    handle_sigint = handle_sigterm

    def handle_sigquit(self) -> None:
        """Fast stop: kill every worker now; their jobs go back to pending uncharged."""
        self.stopping = Stopping.FAST
        self.notifier.stopping("stopping now")
        event(log, "SupervisorStopping", mode="fast")
        self.release(self.producer.drain(), "stopping")
        self.workers.kill_all(Kill.SHUTDOWN)

    def handle_sighup(self) -> None:
        """New code and settings (checked first), then every worker replaced, one at a time,
        each finishing its job first (brooq/supervisor/reload.py)."""
        if not self.stopping:
            reload.begin(self)

    def handle_sigttin(self) -> None:
        """One worker more (serving every topic of this supervisor)."""
        served = sorted({t for slot in self.slots for t in slot.topics})
        self.slots.append(SlotState(served))
        self.producer.add_group(tuple(served))
        event(log, "WorkersChanged", workers=len(self.slots))

    def handle_sigttou(self) -> None:
        """One worker fewer (never below one); the slot's worker finishes its job and leaves."""
        if len(self.slots) > 1:
            self.slots.pop()
            event(log, "WorkersChanged", workers=len(self.slots))

    # --- steps ------------------------------------------------------------------------------

    def read_notices(self) -> None:
        """New jobs wake the producer; cancels interrupt or drop the job wherever it is."""
        heard = self.notices.read()
        self.producer.heard(heard.topics)
        for job_id in heard.canceled:
            self.held.canceled(job_id)

    def read_workers(self, readable: set[int]) -> None:
        """Apply every message the workers sent; a broken or garbled socket kills its worker."""
        now = time.monotonic()
        for child in self.workers:
            if child.sock in readable:
                self.read_worker(child, now)

    def read_worker(self, child: ChildProcess, now: float) -> None:
        """Apply what ``child`` sent; EOF or garbage while it runs means it broke its socket."""
        if child.closed:
            return
        try:
            messages, eof = child.reader.read()
        except protocol.ProtocolError:
            child.close()
            # Garbage on the socket: it is not a brooq worker any more.
            self.workers.kill(child, Kill.BROKEN)
            return
        for message in messages:
            self.dispatcher.apply(child, message, now)
        if eof:
            # Most often the worker just exited (reap_children names why); one that
            # lives on without its socket closed it by mistake and is of no more use.
            child.close()
            child.eof_at = now

    def reap_children(self) -> None:
        """waitpid every worker that ended; settle what it leaves behind."""
        for child, status in self.workers.reaped():
            self.exits.worker_exited(child, status)

    def kill_hung(self, now: float) -> None:
        """SIGKILL workers past their watchdog deadlines, and all of them past the graceful one."""
        self.workers.kill_hung(now)
        if self.stopping is Stopping.GRACEFUL and now >= self.stop_deadline:
            self.workers.kill_all(Kill.SHUTDOWN)

    def keep_leases(self, now: float) -> None:
        """Heartbeat; when heartbeats fail, stop jobs before their lease can end."""
        self.leases.run_once(now)
        self.held.expiring(now, self.settings.lease.total_seconds())
        self.held.confirm_lost(now)

    def probe_database(self, now: float) -> None:
        """A cheap query when the database thread has been quiet, or /healthz was just asked:
        what /healthz says of the database is then never older than a tick or two."""
        last = max(self.db.last_ok, self.db.last_failed)
        asked = self.surface is not None and self.surface.asked_since(last)
        if (asked or now - last >= PROBE_EVERY_S) and not self.db.writes.busy("ping"):
            self.db.writes.submit("ping", self.inspection.ping, lambda result, error: None)

    def release_stale(self, now: float) -> None:
        """Jobs that waited too long in a buffer go back to pending, uncharged."""
        stale = self.producer.stale(now)
        if stale:
            self.release(stale, "waited too long in the buffer")

    def manage_workers(self) -> None:
        """Bring the workers back to the target: spawn missing, retire extra and old ones."""
        if not self.stopping:
            self.workers.manage(self.slots, self.generation)

    def report_ready(self) -> None:
        """READY=1 to systemd once every slot's first worker has booted."""
        if self.notifier.ready_sent or self.stopping:
            return
        booted = sum(1 for c in self.children.values() if c.booted)
        if booted >= len(self.slots):
            self.notifier.ready(f"{booted} workers running")
            event(log, "SupervisorReady", workers=booted)

    def parent_fds(self) -> list[int]:
        """The descriptors only the parent may use: closed in every new worker."""
        return [self.wake_r, self.wake_w, *self.db.filenos(), self.notices.fileno()]
