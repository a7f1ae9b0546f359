"""How the supervisor's services are built from its settings: each builder takes what it uses.

The arbiter calls these once at start (and a reload calls ``limits_of``
again); none of them sees the Supervisor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

from brooq import metrics as prom
from brooq.config import Settings
from brooq.engine.kinds import Registry
from brooq.engine.periodic import PeriodicScheduler
from brooq.engine.reaper import Reaper
from brooq.engine.retention import Retention
from brooq.engine.store import Claimed, Store
from brooq.engine.timer import Every
from brooq.postgres.store import PostgresStore
from brooq.supervisor.database import Database
from brooq.supervisor.maintenance import Maintenance
from brooq.supervisor.producer import Group, Producer
from brooq.vocabulary import Schedule


def statement_bound(lease: timedelta) -> timedelta:
    """How long one statement of the supervisor's lanes, or of a worker, may run: lease/3, at
    least 5 s. A statement that outlives it would let leases run out behind it (or behind the
    locks it holds)."""
    return max(lease / 3, timedelta(seconds=5))


def idle_transaction_bound(lease: timedelta) -> timedelta:
    """How long a worker's transaction may sit idle before PostgreSQL ends its session, and
    its locks with it: lease/12, at least 1 s and at most 5 s; below the lanes' stuck bound
    (max(2 s, lease/6)), so locks left by a worker that died inside its settle (a process it
    forked keeps the socket open) are gone before a lane would cut its own statement."""
    return min(timedelta(seconds=5), max(timedelta(seconds=1), lease / 12))


def open_stores(
    settings: Settings, dsn: str, app_version: str | None = None
) -> tuple[PostgresStore, PostgresStore]:
    """The writes lane's store and the claims lane's, each statement bounded (statement_bound),
    both of the supervisor's ``app_version`` (its claims take that version's jobs and those
    with none; the periodic jobs it enqueues carry it). The claims lane runs its statements
    on generic plans: planned once, not at every claim."""
    bound = statement_bound(settings.lease)
    writes = PostgresStore(
        dsn,
        notify=settings.notify,
        max_payload_bytes=settings.max_payload_bytes,
        statement_timeout=bound,
        app_version=app_version,
    )
    claims = PostgresStore(
        dsn, statement_timeout=bound, app_version=app_version, generic_plans=True
    )
    return writes, claims


def app_version_of(settings: Settings, app_version: str | None) -> str | None:
    """A supervisor's app version: QUEUE_APP_VERSION from its settings (the deploy's),
    else the app's ``Queue(app_version=…)``; None: unversioned."""
    return settings.app_version or app_version


def limits_of(registry: Registry) -> dict[str, int]:
    """The ``max_running`` cap of every topic that has one."""
    return {t: n for t in registry.topics() if (n := registry.options(t).max_running)}


def build_producer(
    settings: Settings,
    registry: Registry,
    *,
    store: Store,
    claims: Database,
    holder: str,
    groups: Sequence[Group],
    workers: int,
    on_claimed: Callable[[list[Claimed], float], None],
) -> Producer:
    """The producer: one buffer per group of topics, caps from the kinds' options, a prefetch
    of ``QUEUE_PREFETCH`` (default: one job per worker)."""
    return Producer(
        store,
        claims,
        holder,
        settings.lease,
        sorted(set(groups)),
        limits_of(registry),
        workers if settings.prefetch is None else settings.prefetch,
        settings.poll_interval,
        max_wait=max(1.0, 2 * settings.poll_interval.total_seconds()),
        on_claimed=on_claimed,
        rates=registry.rates(),
        fair=registry.fairness(),
    )


def build_maintenance(
    settings: Settings,
    schedules: Sequence[Schedule],
    *,
    store: Store,
    writes: Database,
    metrics: prom.Metrics,
) -> Maintenance:
    """The reaper, retention and periodic schedules, on the writes lane."""
    return Maintenance(
        writes,
        Reaper(store, Every(settings.reaper_period), settings.max_expirations),
        Retention(
            store,
            settings.retention_ttl,
            settings.retention_batch,
            Every(settings.retention_period),
            partition_interval=settings.partition_interval,
        ),
        PeriodicScheduler(list(schedules), store.enqueue_many, store.last_scheduled_run),
        metrics,
    )
