"""The supervisor loop, in the style of gunicorn's arbiter.

Signal handlers only queue the signal (and wake the loop through the wakeup
fd). One loop waits on the wakeup pipe, the workers' sockets, the database
lanes and the LISTEN thread, then runs small named steps. Every tick brings
the workers back to the target, so a lost signal costs nothing. The loop
itself never waits for the database: its services (producer, completer,
heartbeat, maintenance) hand their statements to the database lanes.

The arbiter keeps the loop, the signals and the worker count; its other
half, the wiring (wiring.py), builds each part from exactly what it uses.
No part sees the Supervisor: what happens in a tick is the list of steps in
:meth:`Supervisor.tick`, each a call into one part.
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
from brooq.logs import event
from brooq.supervisor.children import ChildProcess, Kill
from brooq.supervisor.pacing import Pacer
from brooq.supervisor.slots import SlotState
from brooq.supervisor.surface import DATABASE_SILENT_S, Surface, health
from brooq.supervisor.wiring import Wiring
from brooq.vocabulary import format_duration

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
FINAL_FLUSH_S = 10.0


class Stopping(StrEnum):
    """How the supervisor is stopping."""

    GRACEFUL = "graceful"
    FAST = "fast"


class Supervisor(Wiring):
    """Forks and supervises the worker processes of one app; claims and settles for them."""

    handled_signals = HANDLED_SIGNALS
    stopping: Stopping | None = None
    stop_deadline = 0.0
    """Graceful stop: when the workers still running are killed."""
    final_deadline = 0.0
    """Stopping with no worker left: how long outcomes may still take to be written."""
    surface: Surface | None = None

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
        """Self-pipe, signal handlers, the parts and their threads, process title."""
        self.signals: stdqueue.SimpleQueue[int] = stdqueue.SimpleQueue()
        self.pacer = Pacer()
        self.readable: set[int] = set()
        """The descriptors the last wait found readable."""
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        prom.set_identity("supervisor")
        self.initialise_metrics()
        self.surface = self.open_surface()
        osproc.become_subreaper()
        signal.set_wakeup_fd(self.wake_w)
        for signum in self.handled_signals:
            signal.signal(signum, self._queue_signal)
        self.wire()
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

    def teardown(self) -> None:
        """Let the database lanes finish their queue, then close what the parent opened."""
        signal.set_wakeup_fd(-1)
        osproc.kill_children()  # what handlers left behind, reparented to us: nothing outlives
        self.close_parts()
        if self.surface is not None:
            self.surface.close()
        for fd in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- the loop ---------------------------------------------------------------------

    def tick(self) -> None:
        """One pass: what woke the loop, the jobs' way through it, then (pacing.py: every
        50 ms, or at once after a signal or an exit) the upkeep of the processes."""
        now = time.monotonic()
        self.pacer.tick(now, reading=any(c.sock in self.readable for c in self.workers))
        self.notifier.pet()
        self.db.collect(self.readable)
        self.read_notices()
        self.read_workers(now)
        self.reap_children()
        self.kill_hung(now)
        self.keep_leases(now)
        self.release_stale(now)
        self.keep_pauses(now)
        self.dispatch(now)
        self.claim(now)
        self.maintain(now)
        self.complete(now)
        self.publish_health(now)
        if self.pacer.housekeeping_due(now):
            self.probe_database(now)
            self.reload_step(now)
            self.manage_workers()
            self.db.check_stuck(now)
            self.report_ready()
            self.register(now)

    def wait(self) -> None:
        """Sleep until a signal, a worker's message, a database result, a NOTIFY or a deadline
        (after the pacer's gap: reports are read in batches)."""
        self.pacer.gap(self.dispatcher.slack(time.monotonic()))
        socks, writes = self.workers.sockets()
        reads = [self.wake_r, *self.db.filenos(), self.notices.fileno(), *socks]
        try:
            ready, writable, _ = select.select(reads, writes, [], self.timeout())
        except InterruptedError:
            return
        self.readable = set(ready)
        self.workers.flush(writable)
        if self.wake_r in ready:
            osproc.drain(self.wake_r)

    def timeout(self) -> float:
        """Seconds until the next thing that must happen."""
        now = time.monotonic()
        deadlines = [self.leases.every.next_at, *self.producer.next_polls(now)]
        if self.notifier.next_pet_at is not None:
            deadlines.append(self.notifier.next_pet_at)
        if (flush_at := self.completer.next_flush_at()) is not None:
            deadlines.append(flush_at)
        deadlines += self.dispatcher.deadlines()
        return self.pacer.timeout(now, deadlines, busy=bool(self.holdings or self.stopping))

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
            self.pacer.poked = True

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
        self.held.release(self.producer.drain(), "stopping")
        for child in self.workers:
            self.dispatcher.retire(child)

    handle_sigint = handle_sigterm

    def handle_sigquit(self) -> None:
        """Fast stop: kill every worker now; their jobs go back to pending uncharged."""
        self.stopping = Stopping.FAST
        self.notifier.stopping("stopping now")
        event(log, "SupervisorStopping", mode="fast")
        self.held.release(self.producer.drain(), "stopping")
        self.workers.kill_all(Kill.SHUTDOWN)

    def handle_sighup(self) -> None:
        """New code and settings (checked first), then every worker replaced, one at a time,
        each finishing its job first (brooq/supervisor/reload.py)."""
        if self.stopping:
            return
        event(log, "SupervisorReloading", generation=self.generation)
        if self.reloader is None:
            self.generation += 1  # no app loader: just renew the workers
        else:
            self.reloader.begin(time.monotonic())

    def handle_sigchld(self) -> None:
        """A worker (or something it left) ended: reap it this tick."""
        self.pacer.reap_due = True

    def handle_sigttin(self) -> None:
        """One worker more (serving every topic of this supervisor)."""
        served = self.served()
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
        if self.notices.fileno() not in self.readable:
            return
        heard = self.notices.read()
        self.paused.heard(heard.pauses)
        self.producer.heard(heard.topics)
        for job_id in heard.canceled:
            self.held.canceled(job_id)

    def read_workers(self, now: float) -> None:
        """Apply every message the workers sent since the last tick."""
        for child in self.workers:
            if child.sock in self.readable:
                self.read_worker(child, now)

    def read_worker(self, child: ChildProcess, now: float) -> None:
        """Apply what ``child`` sent; garbage on its socket means it is no brooq worker now."""
        if not self.dispatcher.read(child, now):
            self.workers.kill(child, Kill.BROKEN)

    def reap_children(self) -> None:
        """After a SIGCHLD (and with every housekeeping, in case one was lost): waitpid every
        worker that ended; settle what it leaves behind."""
        if not self.pacer.reap_now(time.monotonic()):
            return
        for child, status in self.workers.reaped():
            self.pacer.poked = True
            self.read_worker(child, time.monotonic())  # its last words come first
            self.exits.worker_exited(
                child,
                status,
                generation=self.generation,
                stopping=bool(self.stopping),
                slot=self.slots[child.slot] if child.slot < len(self.slots) else None,
            )

    def kill_hung(self, now: float) -> None:
        """SIGKILL workers past their watchdog deadlines, and all of them past the graceful one;
        workers whose socket closed a while ago are broken."""
        self.workers.kill_hung(now)
        self.workers.kill_broken(now)
        if self.stopping is Stopping.GRACEFUL and now >= self.stop_deadline:
            self.workers.kill_all(Kill.SHUTDOWN)

    def keep_leases(self, now: float) -> None:
        """Heartbeat; when heartbeats fail, stop jobs before their lease can end."""
        lease_s = self.settings.lease.total_seconds()
        self.leases.run_once(now)
        self.held.expiring(self.leases.expiring(now, within=lease_s / 3), now, lease_s)
        self.held.confirm_lost(now)

    def release_stale(self, now: float) -> None:
        """Jobs that waited too long in a buffer go back to pending, uncharged."""
        self.held.release(self.producer.stale(now), "waited too long in the buffer")

    def keep_pauses(self, now: float) -> None:
        """Read the paused topics when due; jobs of a paused topic that a claim brought
        meanwhile go back uncharged before any reaches a worker."""
        self.paused.run_once(now)
        self.held.release(self.producer.take_topics(self.paused.topics), "its topic was paused")

    def dispatch(self, now: float) -> None:
        """Buffered jobs to idle workers."""
        self.dispatcher.run_once(now)

    def claim(self, now: float) -> None:
        """Refill the buffers (none once stopping; late claims go straight back)."""
        if self.stopping:
            self.held.release(self.producer.drain(), "stopping")
        else:
            demand = self.dispatcher.demand()
            self.producer.run_once(now, demand.free, demand.workers, demand.idle)

    def maintain(self, now: float) -> None:
        """Reaper, retention and periodic schedules, when each is due."""
        if not self.stopping:
            self.maintenance.run_once(now)

    def complete(self, now: float) -> None:
        """Write the outcomes that are due (all of them once stopping)."""
        self.completer.run_once(now, force=bool(self.stopping))

    def probe_database(self, now: float) -> None:
        """A cheap query when the lanes have been quiet, or /healthz was just asked: what
        /healthz says of the database is then never older than a tick or two."""
        asked = self.surface is not None and self.surface.asked_since(self.db.last_heard)
        self.db.probe(now, self.inspection.ping, asked=asked)

    def reload_step(self, now: float) -> None:
        """Move a SIGHUP reload on (check, load, roll); put what it loaded into service."""
        if self.reloader is None:
            return
        loaded = self.reloader.step(
            now,
            stopping=bool(self.stopping),
            rolled=self.rolled,
            cleanup=self.workers.kill_strays,
        )
        if loaded is not None:
            self.put_into_service(loaded)

    def manage_workers(self) -> None:
        """Bring the workers back to the target: spawn missing, retire extra and old ones
        (no fork while the parent imports new code: a fork would copy its import locks)."""
        if not self.stopping and not (self.reloader and self.reloader.loading):
            self.workers.manage(
                self.slots, self.generation, self.dispatcher.retire, time.monotonic()
            )

    def report_ready(self) -> None:
        """READY=1 to systemd once every slot's first worker has booted."""
        if self.notifier.ready_sent or self.stopping:
            return
        booted = sum(1 for c in self.children.values() if c.booted)
        if booted >= len(self.slots):
            self.notifier.ready(f"{booted} workers running")
            event(log, "SupervisorReady", workers=booted)

    def register(self, now: float) -> None:
        """Keep this supervisor's row in brooq_supervisor current (`brooq workers`)."""
        workers, stopping = list(self.children.values()), bool(self.stopping)
        self.registration.run_once(now, workers=workers, topics=self.served(), stopping=stopping)

    def publish_health(self, now: float) -> None:
        """The verdict /healthz serves until the next tick."""
        if self.surface is not None:
            answering = self.db.answering(now, DATABASE_SILENT_S)
            unwritten = now - (self.completer.oldest() or now)
            children, slots = self.children.values(), len(self.slots)
            verdict = health(self.stopping, answering, children, slots, unwritten)
            self.surface.publish(*verdict, paused=tuple(sorted(self.paused.topics)))

    def parent_fds(self) -> list[int]:
        """The descriptors only the parent may use: closed in every new worker."""
        return [self.wake_r, self.wake_w, *self.db.filenos(), self.notices.fileno()]
