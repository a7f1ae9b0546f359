"""How the supervisor's services are built from its settings (the arbiter only runs them)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from brooq.config import Settings
from brooq.engine.periodic import PeriodicScheduler
from brooq.engine.reaper import Reaper
from brooq.engine.retention import Retention
from brooq.engine.timer import Every
from brooq.postgres.store import PostgresStore
from brooq.supervisor.dispatch import Dispatcher
from brooq.supervisor.maintenance import Maintenance
from brooq.supervisor.producer import Producer

if TYPE_CHECKING:
    from brooq.supervisor.arbiter import Supervisor


def open_stores(settings: Settings, dsn: str) -> tuple[PostgresStore, PostgresStore]:
    """The writes lane's store and the claims lane's, each statement bounded by lease/3.

    A statement that outlives the bound would let leases run out behind it.
    """
    bound = max(settings.lease / 3, timedelta(seconds=5))
    writes = PostgresStore(
        dsn,
        notify=settings.notify,
        max_payload_bytes=settings.max_payload_bytes,
        statement_timeout=bound,
    )
    return writes, PostgresStore(dsn, statement_timeout=bound)


def producer_for(sup: Supervisor) -> Producer:
    """The producer of ``sup``: one buffer per topic group, caps from the kinds' options."""
    s, registry = sup.settings, sup.queue.registry
    limits = {t: n for t in registry.topics() if (n := registry.options(t).max_running)}
    return Producer(
        sup.claims_store,
        sup.db.claims,
        sup.holder,
        s.lease,
        sorted({slot.group for slot in sup.slots}),
        limits,
        len(sup.slots) if s.prefetch is None else s.prefetch,
        s.poll_interval,
        max_wait=max(1.0, 2 * s.poll_interval.total_seconds()),
        on_claimed=sup.held.claimed,
    )


def dispatcher_for(sup: Supervisor) -> Dispatcher:
    """The dispatcher of ``sup``: buffered jobs to idle workers, reports to the completer."""
    return Dispatcher(
        sup.queue.registry,
        sup.producer,
        sup.completer,
        sup.holdings,
        sup.metrics,
        sup.settings.lease.total_seconds(),
        sup.workers.retire,
    )


def maintenance_for(sup: Supervisor) -> Maintenance:
    """The reaper, retention and periodic schedules of ``sup``, on its writes lane."""
    s, store = sup.settings, sup.store
    return Maintenance(
        sup.db.writes,
        Reaper(store, Every(s.reaper_period), s.max_expirations),
        Retention(store, s.retention_ttl, s.retention_batch, Every(s.retention_period)),
        PeriodicScheduler(sup.queue.schedules, store.enqueue_many, store.last_scheduled_run),
        sup.metrics,
    )
