"""The supervisor loop, in the style of gunicorn's arbiter.

Signal handlers only queue the signal (and wake the loop through the wakeup
fd). One loop waits on the wakeup pipe, the children's report pipes and the
cancel LISTEN connection, then runs small named steps: read_reports,
reap_children, read_cancels, heartbeat, kill_hung, maintain, manage_workers.
Every tick brings the children back to the target, so a lost signal costs
nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue as stdqueue
import select
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

import psycopg

from brooq import metrics as prom
from brooq.engine.maintenance import Periodic, Reaper, Retention
from brooq.engine.outcome import crash_outcome
from brooq.engine.periodic import PeriodicScheduler
from brooq.engine.port import Ticket, TopicCount
from brooq.logs import event
from brooq.postgres.connect import connect
from brooq.postgres.store import PostgresStore
from brooq.queue import Queue
from brooq.supervisor import osproc, protocol
from brooq.supervisor.child import EXIT_OK, EXIT_RECYCLE, ChildConfig, child_main
from brooq.supervisor.systemd import Notifier
from brooq.supervisor.workers import InFlight, SlotState, WorkerProcess
from brooq.surface import HealthBoard, ServiceSurface
from brooq.vocabulary import BrooqError, StoreUnavailable, format_duration

log = logging.getLogger("brooq.supervisor")

HANDLED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP,
    signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
)
MAX_TICK_S = 1.0
REPORT_TICK_S = 0.2  # a child's pipe holds ~1,000 reports: read them well before it fills


@dataclass(frozen=True)
class SupervisorConfig:
    """Everything the supervisor needs besides the app."""

    slots: list[list[str]]
    dsn: str
    lease: timedelta
    poll_interval: timedelta
    reaper_period: timedelta
    retention_ttl: timedelta
    retention_batch: int
    retention_period: timedelta
    graceful_timeout: timedelta = timedelta(seconds=30)
    max_jobs_per_worker: int = 0
    max_memory_per_worker: int = 0
    notify: bool = True
    max_payload_bytes: int = 1024 * 1024
    name: str = "app"
    http_addr: str | None = "127.0.0.1:8090"
    http_allow_remote: bool = False
    token: str | None = None


class CancelListener:
    """LISTEN brooq_cancel on a connection of its own; yields canceled job ids."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[Any] | None = None

    def fileno(self) -> int | None:
        """The socket to wait on, connecting (and LISTENing) when needed; None while down."""
        if self.conn is None or self.conn.closed or self.conn.broken:
            try:
                self.conn = connect(self.dsn)
                self.conn.execute("LISTEN brooq_cancel")
            except (StoreUnavailable, psycopg.Error):
                self.conn = None
                return None
        return self.conn.fileno()

    def drain(self) -> set[str]:
        """Ids of jobs canceled since the last call."""
        if self.conn is None:
            return set()
        try:
            return {n.payload for n in self.conn.notifies(timeout=0)}
        except psycopg.Error:
            self.conn = None
            return set()


class Supervisor:
    """Forks and supervises the worker processes of one app."""

    def __init__(self, queue: Queue, config: SupervisorConfig,
                 metrics: prom.Metrics | None = None) -> None:
        self.queue, self.config = queue, config
        self.metrics = metrics or prom.Metrics()
        self.free_metric_ids: list[int] = []
        self.next_metric_id = 0
        self.surface: ServiceSurface | None = None
        self.health_board = HealthBoard()  # the loop writes, the HTTP threads read
        self.pinged_at = 0.0
        self.database_ok = True
        self.notifier = Notifier()
        self.slots = [SlotState(list(t)) for t in config.slots]
        self.workers: dict[int, WorkerProcess] = {}
        self.signals: stdqueue.SimpleQueue[int] = stdqueue.SimpleQueue()
        self.wake_r, self.wake_w = -1, -1
        self.generation = 0
        self.stopping: str | None = None
        self.stop_deadline = 0.0
        self.restarts: Counter[str] = Counter()
        self.hung: Counter[str] = Counter()
        self.lease_lost: Counter[str] = Counter()
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.store = PostgresStore(config.dsn, notify=config.notify,
                                   max_payload_bytes=config.max_payload_bytes)
        self.cancels = CancelListener(config.dsn)
        self.heartbeats = Periodic(config.lease / 3)
        self.reaper = Reaper(self.store, Periodic(config.reaper_period))
        self.retention = Retention(self.store, config.retention_ttl, config.retention_batch,
                                   Periodic(config.retention_period))
        self.unwritten: list[tuple[Ticket, Any, float]] = []
        self.scheduler = PeriodicScheduler(queue.schedules, self.store.enqueue_many,
                                           self.store.last_scheduled_run)
        self.schedule_check = Periodic(timedelta(seconds=1))

    # --- lifecycle ---------------------------------------------------------------

    def run(self) -> int:
        """Serve until stopped by a signal; the exit code (0 after a clean stop)."""
        self.setup()
        try:
            while not (self.stopping and not self.workers):
                self.handle_signals()
                self.wait()
                self.tick()
        finally:
            self.teardown()
        event(log, "SupervisorExited", restarts=sum(self.restarts.values()))
        return 0

    def setup(self) -> None:
        """Self-pipe, signal handlers, process title."""
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
            fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
        prom.set_identity("supervisor")
        self.open_surface()
        signal.set_wakeup_fd(self.wake_w)
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, self._queue_signal)
        osproc.title(f"brooq supervisor {self.config.name} workers={len(self.slots)}")
        event(log, "SupervisorStarted", workers=len(self.slots), pid=self.pid,
              http=self.surface.address if self.surface else "off")

    def open_surface(self) -> None:
        """Serve HTTP_ADDR from the surface's own threads and store.

        Raises SurfaceConfigError before any child is forked. The HTTP threads
        share nothing with the loop but the health board.
        """
        if not self.config.http_addr:
            return
        self.surface = ServiceSurface(
            self.config.http_addr, dsn=self.config.dsn, topics=self.queue.registry.topics(),
            supervisor_pid=self.pid, health=self.health_board, token=self.config.token,
            allow_remote=self.config.http_allow_remote,
        ).start()

    def health(self) -> tuple[bool, str]:
        """/healthz's verdict: not stopping, the database answered its last ping, workers run."""
        if self.stopping:
            return False, f"stopping ({self.stopping})"
        if not self.database_ok:
            return False, "database unavailable"  # the details are in the log, not on HTTP
        running = sum(1 for w in self.workers.values() if w.booted and not w.retiring)
        if running < len(self.slots):
            return False, f"{running} of {len(self.slots)} workers running"
        return True, f"{running} workers running"

    def publish_health(self) -> None:
        """Every tick: publish /healthz's verdict, pinging the database first when it was asked.

        The ping runs when /healthz was read since the last one, else once a
        second: at most one a tick, however many requests come. A fresh snapshot
        is the loop's proof of life: the board reports a stalled loop when it
        stops coming.
        """
        if self.surface is None:
            return
        now = time.monotonic()
        if now - self.pinged_at >= 1.0 or self.health_board.asked_since(self.pinged_at):
            self.pinged_at = now
            try:
                self.store.ping()
                self.database_ok = True
            except StoreUnavailable as exc:
                if self.database_ok:
                    event(log, "DatabaseUnavailable", logging.WARNING, error=str(exc))
                self.database_ok = False
        self.health_board.publish(*self.health())

    def _queue_signal(self, signum: int, frame: FrameType | None) -> None:
        """NO LOGGING, just queue the signal; the wakeup fd wakes the loop."""
        self.signals.put(signum)

    def teardown(self) -> None:
        """Close what the parent opened."""
        signal.set_wakeup_fd(-1)
        for fd in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.store.close()
        if self.cancels.conn is not None:
            self.cancels.conn.close()
        if self.surface is not None:
            self.surface.close()

    def tick(self) -> None:
        """One pass of every step."""
        self.notifier.pet()
        self.read_reports()
        self.reap_children()
        self.read_cancels()
        self.heartbeat()
        self.kill_hung()
        self.maintain()
        self.manage_workers()
        self.report_ready()
        self.publish_health()

    def report_ready(self) -> None:
        """READY=1 to systemd once every slot's first child has booted."""
        if self.notifier.ready_sent or self.stopping:
            return
        booted = sum(1 for w in self.workers.values() if w.booted)
        if booted >= len(self.slots):
            self.notifier.ready(f"{booted} workers running")
            event(log, "SupervisorReady", workers=booted)

    # --- signals --------------------------------------------------------------------

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
        self.stopping = "graceful"
        self.notifier.stopping("stopping: running jobs finish")
        self.stop_deadline = time.monotonic() + self.config.graceful_timeout.total_seconds()
        event(log, "SupervisorStopping", mode="graceful",
              timeout=format_duration(self.config.graceful_timeout))
        for worker in self.workers.values():
            self.signal_worker(worker, signal.SIGTERM)

    handle_sigint = handle_sigterm

    def handle_sigquit(self) -> None:
        """Fast stop: kill every child now; running jobs go back to pending uncharged."""
        self.stopping = "fast"
        self.notifier.stopping("stopping now")
        event(log, "SupervisorStopping", mode="fast")
        for worker in self.workers.values():
            self.kill(worker, "shutdown")

    def handle_sighup(self) -> None:
        """Replace every child, one at a time, each finishing its job first."""
        self.generation += 1
        event(log, "SupervisorReloading", generation=self.generation)

    def handle_sigttin(self) -> None:
        """One worker more (serving every topic of this supervisor)."""
        served = sorted({t for slot in self.slots for t in slot.topics})
        self.slots.append(SlotState(served))
        event(log, "WorkersChanged", workers=len(self.slots))

    def handle_sigttou(self) -> None:
        """One worker fewer (never below one); the slot's child finishes its job and leaves."""
        if len(self.slots) > 1:
            self.slots.pop()
            event(log, "WorkersChanged", workers=len(self.slots))

    def handle_sigchld(self) -> None:
        """Nothing: reap_children runs every tick."""

    # --- waiting ------------------------------------------------------------------------

    def wait(self) -> None:
        """Sleep until a signal, a cancel NOTIFY, or the next deadline.

        The children's report pipes do not wake the loop: at thousands of jobs
        a second that would cost the parent a tick per message. They are read
        every REPORT_TICK_S, and at once before anything that needs them
        (heartbeat, cancel, a child's exit).
        """
        fds = [self.wake_r]
        cancel_fd = self.cancels.fileno() if not self.stopping else None
        if cancel_fd is not None:
            fds.append(cancel_fd)
        try:
            ready, _, _ = select.select(fds, [], [], self.timeout())
        except InterruptedError:
            return
        if self.wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.wake_r, 4096):
                    pass

    def timeout(self) -> float:
        """Seconds until the next thing that must happen, at most MAX_TICK_S."""
        now = time.monotonic()
        deadlines = [self.heartbeats.next_at]
        if self.notifier.next_pet_at is not None:
            deadlines.append(self.notifier.next_pet_at)
        deadlines += [d for w in self.workers.values() if w.job and (d := w.job.next_deadline())]
        cap = REPORT_TICK_S if self.workers else MAX_TICK_S
        return max(0.0, min([cap] + [d - now for d in deadlines]))

    # --- steps -----------------------------------------------------------------------------

    def read_reports(self) -> None:
        """Apply every message the children wrote since the last tick."""
        for worker in list(self.workers.values()):
            if worker.pipe_closed:
                continue
            messages, eof = worker.reader.read()
            for message in messages:
                self.apply_report(worker, message)
            if eof:
                worker.pipe_closed = True

    def apply_report(self, worker: WorkerProcess, message: protocol.Message) -> None:
        """Track what ``worker`` is doing."""
        match message:
            case protocol.Booted():
                worker.booted = True
                self.slots[worker.slot].booted() if worker.slot < len(self.slots) else None
            case protocol.ClaimedJob(job_id, attempt, topic):
                worker.job = self.in_flight(Ticket(job_id, worker.holder, attempt), topic)
            case protocol.FinishedJob(job_id, _):
                if worker.job and worker.job.ticket.job_id == job_id:
                    worker.job = None
            case protocol.Recycling(reason):
                worker.recycle_reason = reason

    def in_flight(self, ticket: Ticket, topic: str) -> InFlight:
        """The watchdog's deadlines for a job just claimed."""
        now = time.monotonic()
        options = self.queue.registry.options(topic)
        grace = (options.watchdog_grace or self.config.lease).total_seconds()
        hard = options.max_execution_timeout
        soft = options.attempt_timeout
        return InFlight(
            ticket=ticket, topic=topic, started=now, grace_s=grace,
            hard_deadline=now + hard.total_seconds() if hard else None,
            hung_deadline=now + soft.total_seconds() + grace if soft else None,
        )

    def reap_children(self) -> None:
        """waitpid every child that ended; record what it leaves behind."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self.workers.pop(pid, None)
            if worker is not None:
                self.worker_exited(worker, status)

    def worker_exited(self, worker: WorkerProcess, status: int) -> None:
        """Settle the job a dead child held; count and log the restart reason."""
        messages, _ = worker.reader.read() if not worker.pipe_closed else ([], True)
        for message in messages:
            self.apply_report(worker, message)
        with contextlib.suppress(OSError):
            os.close(worker.reader.fd)
        how = osproc.describe_exit(status)
        reason = self.exit_reason(worker, status)
        if worker.job is not None:
            self.settle_orphan(worker, how)
        planned = os.WIFEXITED(status) and os.WEXITSTATUS(status) in (EXIT_OK, EXIT_RECYCLE)
        if worker.booted and not planned:
            self.release_unreported(worker)
        if not worker.booted and worker.slot < len(self.slots) and not self.stopping:
            delay = self.slots[worker.slot].boot_failed(time.monotonic())
            event(log, "WorkerBootFailed", logging.ERROR, slot=worker.slot, pid=worker.pid,
                  exit=how, retry_in_s=delay)
        prom.mark_dead(worker.metrics_id)
        self.free_metric_ids.append(int(worker.metrics_id[1:]))
        if reason != "stopped":
            self.restarts[reason] += 1
            self.metrics.restarts.labels(reason=reason).inc()
        level = logging.INFO if reason in ("stopped", "max_jobs", "max_memory", "reload") \
            else logging.WARNING
        event(log, "WorkerExited", level, slot=worker.slot, pid=worker.pid, exit=how,
              reason=reason)

    def exit_reason(self, worker: WorkerProcess, status: int) -> str:
        """Why the child is gone, for logs and brooq_worker_restarts_total."""
        if worker.kill_reason:
            return worker.kill_reason.split(":")[0]
        if worker.recycle_reason:
            return worker.recycle_reason
        if worker.retiring:
            return "reload" if self.generation > worker.generation else "stopped"
        if self.stopping and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return "stopped"
        return "crash"

    def settle_orphan(self, worker: WorkerProcess, how: str) -> None:
        """The child died holding a job: release, record a failure, or write nothing."""
        job = worker.job
        assert job is not None
        kill = worker.kill_reason or ""
        if kill == "shutdown":
            self.store_call(lambda: self.store.release([job.ticket]))
            event(log, "JobReleased", job_id=job.ticket.job_id, topic=job.topic)
            return
        if kill.startswith("hung:lease_lost") or kill.startswith("hung:canceled"):
            return  # the row is no longer ours: canceled, or held by someone else
        options = self.queue.registry.options(job.topic)
        outcome = crash_outcome(self.crash_text(kill, how, job), job.ticket.attempt, options)
        written = self.store_call(lambda: self.store.settle(job.ticket, outcome))
        if written is None:
            self.unwritten.append((job.ticket, outcome, time.monotonic()))
        if written is False:
            return  # no longer ours: the child settled it itself before its report arrived
        if written:
            self.metrics.settled.labels(topic=job.topic, outcome=outcome.label).inc()
        event(log, "JobDead" if outcome.label == "dead" else "JobFailed", logging.WARNING,
              job_id=job.ticket.job_id, topic=job.topic, attempt=job.ticket.attempt,
              outcome=outcome.label, error=outcome.error)

    def release_unreported(self, worker: WorkerProcess) -> None:
        """Give back, uncharged, rows a dead child claimed but never reported.

        A child reports a claim before its handler starts, so a row it still
        holds that the parent never heard of (it died between a claim's commit,
        say the next job of a settle-and-claim, and its report) never ran.
        """
        known = worker.job.ticket.job_id if worker.job else None
        rows = self.store_call(self.store.running) or []
        tickets = [Ticket(str(r["id"]), worker.holder, r["attempts"]) for r in rows
                   if r["locked_by"] == worker.holder and str(r["id"]) != known]
        released = self.store_call(lambda: self.store.release(tickets)) if tickets else None
        for job_id in sorted(released or ()):
            event(log, "JobReleased", job_id=job_id, pid=worker.pid,
                  note="claimed by a worker that died before reporting it")

    def crash_text(self, kill: str, how: str, job: InFlight) -> str:
        """last_error for an attempt whose process died."""
        if kill == "max_execution":
            return f"max_execution_timeout exceeded; the supervisor killed the worker ({how})"
        if kill == "hung:attempt_timeout":
            return (f"attempt timed out and the handler did not exit within "
                    f"{job.grace_s:g}s; the supervisor killed the worker ({how})")
        return f"worker process {how} while running the handler"

    def store_call(self, call: Any) -> Any:
        """Run a store call; on an outage log it and return None (retried by later ticks)."""
        try:
            return call()
        except StoreUnavailable as exc:
            event(log, "DatabaseUnavailable", logging.WARNING, error=str(exc))
            return None

    def read_cancels(self) -> None:
        """Interrupt children running jobs that were just canceled."""
        canceled = self.cancels.drain()
        if canceled:
            self.read_reports()
        for worker in self.workers.values():
            job = worker.job
            if job and job.ticket.job_id in canceled and job.interrupted is None:
                self.interrupt(worker, "canceled", signal.SIGUSR2)

    def heartbeat(self) -> None:
        """One statement extends every lease; a lease not extended is lost."""
        if not self.heartbeats.due(time.monotonic()):
            return
        self.read_reports()
        held = {w.job.ticket.job_id: w for w in self.workers.values()
                if w.job and w.job.interrupted is None}
        if not held:
            return
        tickets = [w.job.ticket for w in held.values() if w.job]
        kept = self.store_call(lambda: self.store.heartbeat(tickets, self.config.lease))
        if kept is None:
            return
        # A row missing from `kept` is often one the child settled during the
        # statement: apply the FinishedJob it sent meanwhile, or the interrupt
        # would hit the child's next job (a spurious LeaseLost).
        self.read_reports()
        for job_id, worker in held.items():
            if job_id not in kept and worker.job and worker.job.ticket.job_id == job_id:
                self.lease_lost[worker.job.topic] += 1
                self.metrics.lease_lost.labels(topic=worker.job.topic).inc()
                self.interrupt(worker, "lease_lost", signal.SIGUSR1)

    def interrupt(self, worker: WorkerProcess, reason: str, signum: int) -> None:
        """Raise an Interrupted in the handler; the watchdog kills it after the grace."""
        assert worker.job is not None
        worker.job.interrupted, worker.job.interrupted_at = reason, time.monotonic()
        event(log, "LeaseLost" if reason == "lease_lost" else "JobCanceled",
              job_id=worker.job.ticket.job_id, topic=worker.job.topic, pid=worker.pid,
              note="interrupting the handler")
        self.signal_worker(worker, signum)

    def kill_hung(self) -> None:
        """SIGKILL children past their watchdog deadlines."""
        now = time.monotonic()
        for worker in list(self.workers.values()):
            if worker.job and worker.kill_reason is None:
                reason = worker.job.kill_due(now)
                if reason:
                    if reason.startswith("hung:"):
                        self.hung[worker.job.topic] += 1
                        self.metrics.hung.labels(topic=worker.job.topic).inc()
                    self.kill(worker, reason)
        if self.stopping == "graceful" and now >= self.stop_deadline:
            for worker in self.workers.values():
                if worker.kill_reason is None:
                    self.kill(worker, "shutdown")

    def maintain(self) -> None:
        """Reaper, retention, and retries of outcomes an outage kept from being written."""
        now = time.monotonic()
        self.count(self.metrics.requeued, self.store_call(lambda: self.reaper.tick(now)))
        self.count(self.metrics.retention_deleted,
                   self.store_call(lambda: self.retention.tick(now)))
        self.metrics.workers.set(len(self.workers))
        if self.scheduler.schedules and self.schedule_check.due(now):
            self.enqueue_periodic()
        self.retry_unwritten(now)

    def retry_unwritten(self, now: float) -> None:
        """Write the outcomes of dead children that an outage kept from being written."""
        pending, self.unwritten = self.unwritten, []
        for ticket, outcome, since in pending:
            if now - since > self.config.lease.total_seconds():
                continue  # the reaper has returned the job by now; nothing to write
            if self.store_call(lambda t=ticket, o=outcome: self.store.settle(t, o)) is None:
                self.unwritten.append((ticket, outcome, since))

    def enqueue_periodic(self) -> None:
        """Enqueue the due runs of the app's schedules (each exactly once, across supervisors)."""
        try:
            runs = self.store_call(self.scheduler.run_once) or []
        except BrooqError as exc:  # a bad schedule must not stop the supervisor
            event(log, "PeriodicFailed", logging.ERROR, error=str(exc))
            return
        for run in runs:
            fields = {"schedule": run.schedule.name, "run": run.run.isoformat(),
                      "job_id": run.result.id}
            if run.result.created:
                self.metrics.periodic.labels(schedule=run.schedule.name).inc()
                event(log, "PeriodicEnqueued", **fields)
            else:
                event(log, "PeriodicAlreadyEnqueued", logging.DEBUG, **fields)

    @staticmethod
    def count(counter: Any, counts: list[TopicCount] | None) -> None:
        """Add per-topic counts to a counter."""
        for topic, n in counts or []:
            counter.labels(topic=topic).inc(n)

    def manage_workers(self) -> None:
        """Bring the children back to the target: spawn missing, retire extra and old ones."""
        if self.stopping:
            return
        self.retire_extra()
        self.rotate_generation()
        self.spawn_missing()

    def retire_extra(self) -> None:
        """Children whose slot no longer exists (after TTOU) finish their job and leave."""
        for worker in self.workers.values():
            if worker.slot >= len(self.slots) and not worker.retiring:
                worker.retiring = True
                self.signal_worker(worker, signal.SIGTERM)

    def rotate_generation(self) -> None:
        """After HUP, replace the old children one by one (the replacement starts first)."""
        if any(w.retiring for w in self.workers.values()):
            return
        old = [w for w in self.workers.values() if w.generation < self.generation]
        if old:
            oldest = min(old, key=lambda w: w.started)
            oldest.retiring = True
            self.signal_worker(oldest, signal.SIGTERM)

    def spawn_missing(self) -> None:
        """Fork a child for every slot without a live, non-retiring one."""
        now = time.monotonic()
        taken = {w.slot for w in self.workers.values() if not w.retiring}
        for slot_no, slot in enumerate(self.slots):
            if slot_no not in taken and now >= slot.not_before:
                self.spawn(slot_no)

    # --- processes ---------------------------------------------------------------------

    def spawn(self, slot_no: int) -> None:
        """Fork one child for ``slot_no``."""
        read_fd, write_fd = os.pipe()
        metrics_id = self.take_metrics_id()
        config = self.child_config(slot_no, metrics_id)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.become_child(read_fd)
            child_main(self.queue, config, write_fd, self.pid, self.metrics)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        worker = WorkerProcess(
            slot=slot_no, pid=pid, reader=protocol.Reader(read_fd), started=time.monotonic(),
            generation=self.generation, holder=f"{self.host}:{pid}", metrics_id=metrics_id,
        )
        self.workers[pid] = worker
        event(log, "WorkerStarted", slot=slot_no, pid=pid, topics=",".join(config.topics))

    def become_child(self, read_fd: int) -> None:
        """In the new child: drop the parent's signal handling and its file descriptors."""
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        # The surface's sockets are closed by brooq.surface.server's at-fork hook.
        fds = [read_fd, self.wake_r, self.wake_w] + [w.reader.fd for w in self.workers.values()]
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def take_metrics_id(self) -> str:
        """The lowest metrics id no live (unreaped) child holds: files are reused, not piled up."""
        if self.free_metric_ids:
            self.free_metric_ids.sort()
            return f"w{self.free_metric_ids.pop(0)}"
        self.next_metric_id += 1
        return f"w{self.next_metric_id - 1}"

    def child_config(self, slot_no: int, metrics_id: str) -> ChildConfig:
        """The configuration of the child serving ``slot_no``."""
        c = self.config
        return ChildConfig(
            slot=slot_no, topics=self.slots[slot_no].topics, dsn=c.dsn, lease=c.lease,
            metrics_id=metrics_id,
            poll_interval=c.poll_interval, max_jobs=c.max_jobs_per_worker,
            max_memory=c.max_memory_per_worker, notify=c.notify,
            max_payload_bytes=c.max_payload_bytes,
        )

    def signal_worker(self, worker: WorkerProcess, signum: int) -> None:
        """Send ``signum`` to a child that may already be gone."""
        worker.signals_sent.append(signal.Signals(signum).name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signum)

    def kill(self, worker: WorkerProcess, reason: str) -> None:
        """SIGKILL a child; ``reason`` decides what reap_children writes for its job."""
        worker.kill_reason = reason
        event(log, "WorkerKilled", logging.WARNING, slot=worker.slot, pid=worker.pid,
              reason=reason, job_id=worker.job.ticket.job_id if worker.job else None)
        self.signal_worker(worker, signal.SIGKILL)
