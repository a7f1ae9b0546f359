"""How a supervisor's parts are built, and rebuilt by a reload: each from what it uses.

The arbiter (arbiter.py) runs the loop and the signals; this half of the
Supervisor holds its values and its parts, and builds every part from
exactly the collaborators it names in its signature: the stores and their
lanes, the holdings, the producer and completer, callbacks into the worker
processes. No part sees the Supervisor.
"""

from __future__ import annotations

import logging
import os
import signal

from brooq import metrics as prom
from brooq.config import Settings
from brooq.engine.executor import crashed
from brooq.logs import event
from brooq.postgres.inspection import PostgresInspection
from brooq.postgres.registration import PostgresRegistration
from brooq.queue import Queue
from brooq.supervisor import reload, services
from brooq.supervisor.children import RESTART_REASONS
from brooq.supervisor.completer import Completer
from brooq.supervisor.database import DatabaseThread, Lanes
from brooq.supervisor.dispatch import Dispatcher
from brooq.supervisor.exits import Exits
from brooq.supervisor.held import HeldJobs
from brooq.supervisor.leases import Holdings, LeaseKeeper
from brooq.supervisor.notices import Notices
from brooq.supervisor.pauses import PausedTopics
from brooq.supervisor.processes import Processes
from brooq.supervisor.registration import Registration
from brooq.supervisor.slots import SlotState
from brooq.supervisor.surface import Surface, busy_by_topic
from brooq.supervisor.systemd import Notifier
from brooq.vocabulary import holder_id

log = logging.getLogger("brooq.supervisor")


class Wiring:
    """A supervisor's values and parts (the arbiter's Supervisor runs them)."""

    handled_signals: tuple[signal.Signals, ...] = ()
    """What the parent handles itself: a new worker sets them back to the defaults."""

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
        self.reloader = reloader
        self.holder = holder_id()
        self.pid = os.getpid()
        self.slots = [SlotState(sorted(t)) for t in slots]
        self.workers = Processes(
            queue, settings, dsn, self.metrics, self.pid, self.parent_fds, self.handled_signals
        )
        self.children = self.workers.children
        self.notifier = reloader.notifier if reloader is not None else Notifier()
        self.generation = 0

    def wire(self) -> None:
        """Build every part from exactly what it uses: the stores and their lanes, the
        holdings, the producer and completer, and callbacks into the workers."""
        s, registry = self.settings, self.queue.registry
        self.app_version = services.app_version_of(s, self.queue.app_version)
        self.queue.app_version = self.app_version  # what handlers enqueue carries it too
        self.store, self.claims_store = services.open_stores(s, self.dsn, self.app_version)
        stuck_after = max(2.0, s.lease.total_seconds() / 6)
        self.db = Lanes(
            DatabaseThread(self.claims_store.connector, stuck_after),
            DatabaseThread(self.store.connector, stuck_after),
        )
        self.inspection = PostgresInspection(self.store.connector)
        self.notices = Notices(s.listen_dsn(self.dsn), s.poll_interval, pooled=not s.listen_url)
        self.holdings = Holdings()
        self.producer = services.build_producer(
            s,
            registry,
            store=self.claims_store,
            claims=self.db.claims,
            holder=self.holder,
            groups=[slot.group for slot in self.slots],
            workers=len(self.slots),
            on_claimed=lambda claimed, lease_end: self.held.claimed(claimed, lease_end),
        )
        self.completer = Completer(
            self.store, self.db.writes, lambda ok, lost: self.held.flushed(ok, lost)
        )
        self.dispatcher = Dispatcher(
            registry,
            self.producer,
            self.completer,
            self.holdings,
            self.metrics,
            s.lease.total_seconds(),
            workers=self.children.values,
        )
        self.held = HeldJobs(
            holdings=self.holdings,
            metrics=self.metrics,
            writes=self.db.writes,
            store=self.store,
            withdraw=self.dispatcher.withdraw,
            running=self.dispatcher.running_child,
            interrupt=self.dispatcher.interrupt,
            kill=self.workers.kill,
        )
        self.leases = LeaseKeeper(
            self.claims_store,
            self.db.claims,
            self.holdings,
            s.lease,
            self.held.lost,
            on_kept=self.dispatcher.post_leases,
        )
        self.exits = Exits(
            options=self.dispatcher.options,
            completer=self.completer,
            producer=self.producer,
            holdings=self.holdings,
            release=self.held.release,
            restarted=lambda reason: self.metrics.restarts.labels(reason=str(reason)).inc(),
            lease_s=s.lease.total_seconds(),
            crashed=lambda claimed, outcome, started: crashed(
                self.queue.registry,
                claimed,
                outcome,
                started,  # the app in service (reload)
            ),
        )
        self.paused = PausedTopics(self.db.claims, self.claims_store.pause_view, self.pause_held)
        try:  # known from the first claim and the first answer of /healthz
            self.claims_store.pause_view.refresh()
            self.paused.apply()
        except Exception:  # the database is away: the loop reads them again soon
            log.debug("paused topics not read at start", exc_info=True)
        self.maintenance = services.build_maintenance(
            s, self.queue.schedules, store=self.store, writes=self.db.writes, metrics=self.metrics
        )
        self.registration = Registration(  # brooq_supervisor row: `brooq workers`
            PostgresRegistration(self.store.connector),
            self.db.writes,
            holder=self.holder,
            app=self.name,
            app_version=self.app_version,
        )

    def pause_held(self, topics: set[str]) -> None:
        """Give back, uncharged, every job of ``topics`` held here and not started (in the
        buffer or queued in a worker); the running ones finish."""
        unstarted = [
            claimed
            for job_id, held in list(self.holdings.jobs.items())
            if held.topic in topics and (claimed := self.dispatcher.withdraw(job_id)) is not None
        ]
        self.held.release(unstarted, "its topic was paused")

    def close_parts(self) -> None:
        """Let the lanes finish what is queued (5 s at most), then close the connections."""
        self.db.stop(timeout=5.0)
        self.notices.stop()
        self.store.close()
        self.claims_store.close()

    def rolled(self) -> tuple[int, int] | None:
        """(workers, generation) once every slot runs a booted worker of the newest generation."""
        if self.workers.rolled(self.generation, len(self.slots)):
            return len(self.children), self.generation
        return None

    def open_surface(self) -> Surface | None:
        """/healthz, /metrics and the dashboard on HTTP_ADDR (None when it is off)."""
        return Surface.open(
            self.settings,
            dsn=self.dsn,
            topics=lambda: self.queue.registry.topics(),
            supervisor_pid=self.pid,
            workers=lambda: busy_by_topic(self.children.values()),
            app_version=services.app_version_of(self.settings, self.queue.app_version),
        )

    def served(self) -> list[str]:
        """Every topic some worker slot serves now."""
        return sorted({t for slot in self.slots for t in slot.topics})

    def initialise_metrics(self) -> None:
        """Every series of the served topics, restart reasons and schedules, at zero."""
        self.metrics.initialise(
            self.queue.registry.topics(),
            [str(r) for r in RESTART_REASONS],
            [s.name for s in self.queue.schedules],
        )

    def put_into_service(self, loaded: reload.Loaded) -> None:
        """A reload's new app, settings and slots into every part; a new generation."""
        settings, unapplied = reload.kept_settings(self.settings, loaded.settings)
        self.queue, self.settings = loaded.queue, settings
        registry = loaded.queue.registry
        self.workers.queue, self.workers.settings = loaded.queue, settings  # what new forks run
        self.dispatcher.kinds = registry
        self.producer.limits = services.limits_of(registry)
        self.producer.rates = registry.rates()
        self.producer.fair = registry.fairness()
        loaded.queue.app_version = self.app_version  # the version it claims as stays
        self.maintenance.scheduler.schedules = list(loaded.queue.schedules)
        self.initialise_metrics()
        assert self.reloader is not None
        if (configured := self.reloader.new_slots(loaded)) is not None:
            self.slots = [SlotState(t) for t in configured]
            for slot in self.slots:
                self.producer.add_group(slot.group)
        self.generation += 1
        event(
            log,
            "SupervisorReloaded",
            generation=self.generation,
            workers=len(self.slots),
            topics=",".join(registry.topics()),
            needs_restart=",".join(unapplied) or None,
        )

    def parent_fds(self) -> list[int]:
        """The descriptors only the parent may use: closed in every new worker."""
        raise NotImplementedError
