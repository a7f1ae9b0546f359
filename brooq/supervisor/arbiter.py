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
import socket
import sys
import time
from datetime import timedelta
from enum import StrEnum
from types import FrameType

from brooq import metrics as prom
from brooq import osproc
from brooq.config import Settings
from brooq.engine.periodic import PeriodicScheduler
from brooq.engine.reaper import Reaper
from brooq.engine.retention import Retention
from brooq.engine.store import Claimed
from brooq.engine.timer import Every
from brooq.logs import event
from brooq.postgres.inspection import PostgresInspection
from brooq.postgres.store import PostgresStore
from brooq.queue import Queue
from brooq.supervisor import orphans, protocol
from brooq.supervisor.child import WorkerConfig, worker_main
from brooq.supervisor.children import RESTART_REASONS, ChildProcess, Exit, Interrupt, Kill
from brooq.supervisor.completer import Completer, Pending, count_by_label
from brooq.supervisor.database import DatabaseThread, Lanes
from brooq.supervisor.dispatch import Dispatcher
from brooq.supervisor.leases import Held, Holdings, LeaseKeeper
from brooq.supervisor.maintenance import Maintenance
from brooq.supervisor.notices import Notices
from brooq.supervisor.producer import Group, Producer
from brooq.supervisor.registration import Registration
from brooq.supervisor.slots import SlotState
from brooq.supervisor.surface import Surface
from brooq.supervisor.systemd import Notifier
from brooq.vocabulary import format_duration, holder_id

log = logging.getLogger("brooq.supervisor")

HANDLED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP,
    signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
)
MAX_TICK_S = 1.0
BUSY_TICK_S = 0.1
STABLE_AFTER_S = 10.0
"""A worker that crashes sooner than this after its start counts toward its slot's backoff."""
FINAL_FLUSH_S = 10.0
PROBE_EVERY_S = 2.0
FORK_WAIT_S = 0.05
"""How long a spawn waits for the database and LISTEN threads to leave libpq."""
BROKEN_GRACE_S = 0.5
"""How long a worker whose socket closed may take to exit before it counts as broken."""


class Stopping(StrEnum):
    """How the supervisor is stopping."""

    GRACEFUL = "graceful"
    FAST = "fast"


class Supervisor:
    """Forks and supervises the worker processes of one app; claims and settles for them."""

    def __init__(self, queue: Queue, settings: Settings, slots: list[list[str]], dsn: str,
                 name: str = "app", metrics: prom.Metrics | None = None) -> None:
        self.queue, self.settings, self.dsn, self.name = queue, settings, dsn, name
        self.metrics = metrics or prom.Metrics()
        self.holder = holder_id()
        self.pid = os.getpid()
        self.slots = [SlotState(sorted(t)) for t in slots]
        self.children: dict[int, ChildProcess] = {}
        self.signals: stdqueue.SimpleQueue[int] = stdqueue.SimpleQueue()
        self.notifier = Notifier()
        self.generation = 0
        self.stopping: Stopping | None = None
        self.stop_deadline = 0.0
        self.free_metric_ids: list[int] = []
        self.next_metric_id = 0
        self.restarts = 0
        lease = settings.lease
        bound = max(lease / 3, timedelta(seconds=5))
        self.store = PostgresStore(dsn, notify=settings.notify,
                                   max_payload_bytes=settings.max_payload_bytes,
                                   statement_timeout=bound)
        self.claims_store = PostgresStore(dsn, statement_timeout=bound)
        self.holdings = Holdings()
        self.surface: Surface | None = None

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
        event(log, "SupervisorExited", restarts=self.restarts)
        return 0

    def setup(self) -> None:
        """Self-pipe, signal handlers, threads, services, process title."""
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        prom.set_identity("supervisor")
        topics = self.queue.registry.topics()
        self.metrics.initialise(topics, [str(r) for r in RESTART_REASONS],
                                [s.name for s in self.queue.schedules])
        self.surface = Surface.open(self)
        signal.set_wakeup_fd(self.wake_w)
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, self._queue_signal)
        self.start_services()
        if self.surface is not None:
            self.surface.start()
        osproc.title(f"brooq supervisor {self.name} workers={len(self.slots)}")
        event(log, "SupervisorStarted", workers=len(self.slots), pid=self.pid,
              holder=self.holder, http=self.surface.address if self.surface else "off")

    def start_services(self) -> None:
        """The database and LISTEN threads, and the services that use them."""
        s, lease = self.settings, self.settings.lease
        stuck_after = max(2.0, lease.total_seconds() / 6)
        self.db = Lanes(DatabaseThread(self.claims_store.connector, stuck_after),
                        DatabaseThread(self.store.connector, stuck_after))
        self.inspection = PostgresInspection(self.store.connector)
        self.notices = Notices(self.dsn)
        limits = {t: n for t in self.queue.registry.topics()
                  if (n := self.queue.registry.options(t).max_running)}
        prefetch = len(self.slots) if s.prefetch is None else s.prefetch
        self.producer = Producer(
            self.claims_store, self.db.claims, self.holder, lease, sorted({slot.group for slot in self.slots}),
            limits, prefetch, s.poll_interval,
            max_wait=max(1.0, 2 * s.poll_interval.total_seconds()),
            on_claimed=self.claimed)
        self.completer = Completer(self.store, self.db.writes, self.flushed)
        self.leases = LeaseKeeper(self.claims_store, self.db.claims, self.holdings, lease,
                                  self.lost)
        self.dispatcher = Dispatcher(self.queue.registry, self.producer, self.completer,
                                     self.holdings, self.metrics, lease.total_seconds(),
                                     self.retire)
        self.maintenance = Maintenance(
            self.db.writes, Reaper(self.store, Every(s.reaper_period), s.max_expirations),
            Retention(self.store, s.retention_ttl, s.retention_batch, Every(s.retention_period)),
            PeriodicScheduler(self.queue.schedules, self.store.enqueue_many,
                              self.store.last_scheduled_run),
            self.metrics)
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
        self.read_workers()
        self.reap_children()
        self.kill_hung(now)
        self.kill_broken(now)
        self.keep_leases(now)
        self.release_stale(now)
        self.dispatcher.run_once(self.children.values(), now)
        if not self.stopping:
            self.producer.run_once(now, *self.group_counts())
            self.maintenance.run_once(now)
        self.completer.run_once(now, force=bool(self.stopping))
        if self.stopping:
            self.release(self.producer.drain(), "stopping")  # claims that came back late
        self.probe_database(now)
        self.manage_workers()
        self.db.check_stuck(now)
        self.report_ready()
        self.registration.run_once(now)
        if self.surface is not None:
            self.surface.publish(self)

    def wait(self) -> None:
        """Sleep until a signal, a worker's message, a database result, a NOTIFY or a deadline."""
        reads = [self.wake_r, *self.db.filenos(), self.notices.fileno()]
        reads += [c.sock for c in self.children.values() if not c.closed]
        writes = [c.sock for c in self.children.values() if c.outbox and not c.closed]
        try:
            ready, writable, _ = select.select(reads, writes, [], self.timeout())
        except InterruptedError:
            return
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
        event(log, "SupervisorStopping", mode="graceful",
              timeout=format_duration(self.settings.graceful_timeout))
        self.release(self.producer.drain(), "stopping")
        for child in self.children.values():
            self.retire(child)

    handle_sigint = handle_sigterm

    def handle_sigquit(self) -> None:
        """Fast stop: kill every worker now; their jobs go back to pending uncharged."""
        self.stopping = Stopping.FAST
        self.notifier.stopping("stopping now")
        event(log, "SupervisorStopping", mode="fast")
        self.release(self.producer.drain(), "stopping")
        for child in self.children.values():
            if child.kill is None:
                self.kill(child, Kill.SHUTDOWN)

    def handle_sighup(self) -> None:
        """Replace every worker, one at a time, each finishing its job first."""
        self.generation += 1
        event(log, "SupervisorReloading", generation=self.generation)

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
            if self.producer.drop(job_id) is not None:
                self.holdings.drop(job_id)
            for child in self.children.values():
                if child.job and child.job.claimed.id == job_id:
                    self.dispatcher.interrupt(child, Interrupt.CANCELED, "interrupting the handler")

    def read_workers(self) -> None:
        """Apply every message the workers sent; a broken or garbled socket kills its worker."""
        now = time.monotonic()
        for child in list(self.children.values()):
            self.read_worker(child, now)

    def read_worker(self, child: ChildProcess, now: float) -> None:
        """Apply what ``child`` sent; EOF or garbage while it runs means it broke its socket."""
        if child.closed:
            return
        try:
            messages, eof = child.reader.read()
        except protocol.ProtocolError:
            child.close()
            self.kill(child, Kill.BROKEN)  # garbage on the socket: not a brooq worker any more
            return
        for message in messages:
            self.dispatcher.apply(child, message, now)
        if eof:
            # Most often the worker just exited (reap_children names why); one that
            # lives on without its socket closed it by mistake and is of no more use.
            child.close()
            child.eof_at = now

    def kill_broken(self, now: float) -> None:
        """Kill workers still alive a while after their socket closed."""
        for child in self.children.values():
            if child.eof_at and child.kill is None and now - child.eof_at >= BROKEN_GRACE_S:
                self.kill(child, Kill.BROKEN)

    def reap_children(self) -> None:
        """waitpid every worker that ended; settle what it leaves behind."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None:
                self.worker_exited(child, status)

    def worker_exited(self, child: ChildProcess, status: int) -> None:
        """Settle the job a dead worker held; count and log why it is gone."""
        self.read_worker(child, time.monotonic())
        child.close()
        how = osproc.describe_exit(status)
        reason = orphans.exit_reason(child, status, self.generation, bool(self.stopping))
        held_a_job = child.job is not None
        if held_a_job:
            self.orphaned(child, status, how)
        self.slot_backoff(child, status, how, held_a_job)
        prom.mark_dead(child.metrics_id)
        self.free_metric_ids.append(int(child.metrics_id[1:]))
        if reason not in (Exit.STOPPED, Exit.SHUTDOWN):
            self.restarts += 1
            self.metrics.restarts.labels(reason=str(reason)).inc()
        quiet = reason in (Exit.STOPPED, Exit.MAX_JOBS, Exit.MAX_MEMORY, Exit.RELOAD)
        event(log, "WorkerExited", logging.INFO if quiet else logging.WARNING, slot=child.slot,
              pid=child.pid, exit=how, reason=str(reason))

    def orphaned(self, child: ChildProcess, status: int, how: str) -> None:
        """Carry out the orphans service's decision about the job ``child`` held."""
        job = child.job
        assert job is not None
        claimed = job.claimed
        options = self.dispatcher.options(claimed.topic)
        orphan = orphans.decide_orphan(child, job, status, how, options)
        match orphan.fate:
            case orphans.Fate.RELEASE:
                self.release([claimed], "shutdown")
            case orphans.Fate.PUT_BACK if not self.stopping:
                self.producer.put_back(child.group, claimed, time.monotonic())
            case orphans.Fate.PUT_BACK:
                self.release([claimed], "stopping")
            case orphans.Fate.RECORD if orphan.outcome is not None:
                self.completer.add(claimed.ticket, orphan.outcome, claimed.topic, time.monotonic())
                event(log, "JobDead" if orphan.outcome.label == "dead" else "JobFailed",
                      logging.WARNING, job_id=claimed.id, topic=claimed.topic,
                      attempt=claimed.attempt, outcome=orphan.outcome.label,
                      error=orphan.outcome.error)
            case _:
                self.holdings.drop(claimed.id)

    def slot_backoff(self, child: ChildProcess, status: int, how: str, held_a_job: bool) -> None:
        """A worker that died at boot, or soon after without any job to blame, starts again
        only after a backoff (a job that kills its worker is charged for it instead)."""
        if child.slot >= len(self.slots) or self.stopping:
            return
        slot = self.slots[child.slot]
        lived = time.monotonic() - child.started
        if (orphans.planned(status) or child.kill is not None or held_a_job
                or child.finished_jobs or lived >= STABLE_AFTER_S):
            slot.booted()
            return
        delay = slot.boot_failed(time.monotonic())
        event(log, "WorkerBootFailed" if not child.booted else "WorkerCrashLoop", logging.ERROR,
              slot=child.slot, pid=child.pid, exit=how, retry_in_s=delay)

    def kill_hung(self, now: float) -> None:
        """SIGKILL workers past their watchdog deadlines, and all of them past the graceful one."""
        for child in list(self.children.values()):
            if child.job and child.kill is None and (due := child.job.kill_due(now)):
                kill, why = due
                if kill is Kill.HUNG:
                    self.metrics.hung.labels(topic=child.job.claimed.topic).inc()
                self.kill(child, kill, why)
        if self.stopping is Stopping.GRACEFUL and now >= self.stop_deadline:
            for child in self.children.values():
                if child.kill is None:
                    self.kill(child, Kill.SHUTDOWN)

    def keep_leases(self, now: float) -> None:
        """Heartbeat; when heartbeats fail, stop jobs before their lease can end."""
        self.leases.run_once(now)
        lease_s = self.settings.lease.total_seconds()
        for held in self.leases.expiring(now, within=lease_s / 3):
            child = self.running(held.ticket.job_id)
            if child is None:
                if self.producer.drop(held.ticket.job_id) is not None:
                    self.holdings.drop(held.ticket.job_id)
                continue
            self.dispatcher.interrupt(child, Interrupt.LEASE_LOST,
                                      "the database did not answer heartbeats; the lease ends soon")
            if held.lease_end - now <= min(1.0, lease_s / 6) and child.kill is None:
                self.kill(child, Kill.LEASE_ENDING)

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
        if self.stopping:
            return
        for child in self.children.values():
            if child.slot >= len(self.slots) and not child.retiring:
                self.retire(child)
        if not any(c.retiring for c in self.children.values()):
            old = [c for c in self.children.values() if c.generation < self.generation]
            if old:
                self.retire(min(old, key=lambda c: c.started))
        now = time.monotonic()
        taken = {c.slot for c in self.children.values() if not c.retiring}
        for slot_no, slot in enumerate(self.slots):
            if slot_no not in taken and now >= slot.not_before:
                self.spawn(slot_no)

    def report_ready(self) -> None:
        """READY=1 to systemd once every slot's first worker has booted."""
        if self.notifier.ready_sent or self.stopping:
            return
        booted = sum(1 for c in self.children.values() if c.booted)
        if booted >= len(self.slots):
            self.notifier.ready(f"{booted} workers running")
            event(log, "SupervisorReady", workers=booted)

    # --- callbacks of the services ----------------------------------------------------

    def claimed(self, claimed: list[Claimed], lease_end: float) -> None:
        """The producer claimed jobs: hold them, count them."""
        topics: dict[str, int] = {}
        for c in claimed:
            self.holdings.add(c.ticket, c.topic, lease_end)
            topics[c.topic] = topics.get(c.topic, 0) + 1
        for topic, n in topics.items():
            self.metrics.claimed.labels(topic=topic).inc(n)

    def flushed(self, written: list[Pending], lost: list[Pending]) -> None:
        """The completer wrote outcomes: count them; those no longer held lost their lease."""
        for p in written + lost:
            self.holdings.drop(p.ticket.job_id)
        for (topic, label), n in count_by_label(written).items():
            self.metrics.settled.labels(topic=topic, outcome=label).inc(n)
        for p in lost:
            self.metrics.lease_lost.labels(topic=p.topic).inc()
            event(log, "LeaseLost", logging.WARNING, job_id=p.ticket.job_id, topic=p.topic,
                  outcome=p.outcome.label, note="outcome not written: the lease was lost")

    def lost(self, held: Held) -> None:
        """A heartbeat did not find a job ours any more (canceled, or reaped and taken)."""
        job_id = held.ticket.job_id
        self.holdings.drop(job_id)
        if self.producer.drop(job_id) is not None:
            return
        child = self.running(job_id)
        if child is not None:
            self.read_worker(child, time.monotonic())  # it may have just finished it
            child = self.running(job_id)
        if child is not None and child.job and child.job.claimed.ticket == held.ticket:
            self.metrics.lease_lost.labels(topic=held.topic).inc()
            self.dispatcher.interrupt(child, Interrupt.LEASE_LOST, "interrupting the handler")

    # --- jobs and processes -------------------------------------------------------------

    def running(self, job_id: str) -> ChildProcess | None:
        """The worker running ``job_id``, if any."""
        for child in self.children.values():
            if child.job is not None and child.job.claimed.id == job_id:
                return child
        return None

    def release(self, claimed: list[Claimed], why: str) -> None:
        """Give jobs back to pending, uncharged (a database task)."""
        if not claimed:
            return
        tickets = [c.ticket for c in claimed]
        for c in claimed:
            self.holdings.drop(c.id)

        def done(released: set[str] | None, error: BaseException | None) -> None:
            for job_id in sorted(released or ()):
                event(log, "JobReleased", job_id=job_id, note=why)

        self.db.writes.submit("release", lambda: self.store.release(tickets), done)

    def retire(self, child: ChildProcess) -> None:
        """The worker finishes its job (if any) and leaves."""
        child.retiring = True
        if child.job is None and not child.stop_sent:
            child.stop_sent = True
            child.send(protocol.Stop())

    def kill(self, child: ChildProcess, reason: Kill, detail: Interrupt | None = None) -> None:
        """SIGKILL a worker; ``reason`` decides what becomes of its job."""
        child.kill, child.kill_detail = reason, str(detail) if detail else None
        shown = f"{reason}:{detail}" if detail else str(reason)
        event(log, "WorkerKilled", logging.WARNING, slot=child.slot, pid=child.pid,
              reason=shown, job_id=child.job.claimed.id if child.job else None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)

    def spawn(self, slot_no: int) -> None:
        """Fork one worker for ``slot_no``, connected by a socket pair."""
        parent_end, child_end = socket.socketpair()
        metrics_id = self.take_metrics_id()
        slot = self.slots[slot_no]
        config = WorkerConfig(
            slot=slot_no, topics=tuple(slot.topics), dsn=self.dsn,
            max_jobs=self.settings.max_jobs_per_worker,
            max_memory=self.settings.max_memory_per_worker, notify=self.settings.notify,
            max_payload_bytes=self.settings.max_payload_bytes, metrics_id=metrics_id)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = osproc.fork_when_quiet(timeout=FORK_WAIT_S)
        if pid is None:  # a thread is busy with the database: the next tick tries again
            parent_end.close()
            child_end.close()
            self.free_metric_ids.append(int(metrics_id[1:]))
            return
        if pid == 0:
            self.become_child(parent_end.detach())
            worker_main(self.queue, config, child_end.detach(), self.pid, self.metrics)
        child_end.close()
        sock = parent_end.detach()
        os.set_blocking(sock, False)
        self.children[pid] = ChildProcess(
            slot=slot_no, pid=pid, group=slot.group, sock=sock, started=time.monotonic(),
            generation=self.generation, metrics_id=metrics_id)
        event(log, "WorkerStarted", slot=slot_no, pid=pid, topics=",".join(slot.topics))

    def become_child(self, parent_end: int) -> None:
        """In the new worker: drop the parent's signal handling and its file descriptors."""
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        fds = [parent_end, self.wake_r, self.wake_w, *self.db.filenos(), self.notices.fileno()]
        fds += [c.sock for c in self.children.values()]
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def take_metrics_id(self) -> str:
        """The lowest metrics id no live (unreaped) worker holds: files are reused."""
        if self.free_metric_ids:
            self.free_metric_ids.sort()
            return f"w{self.free_metric_ids.pop(0)}"
        self.next_metric_id += 1
        return f"w{self.next_metric_id - 1}"

    def group_counts(self) -> tuple[dict[Group, int], dict[Group, int]]:
        """Idle workers and all workers, per group."""
        idle: dict[Group, int] = {}
        total: dict[Group, int] = {}
        for child in self.children.values():
            total[child.group] = total.get(child.group, 0) + 1
            if child.idle:
                idle[child.group] = idle.get(child.group, 0) + 1
        return idle, total
