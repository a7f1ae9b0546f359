"""The Queue: register kinds, enqueue (in your own transaction), cancel, read, drain."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from brooq.engine.kinds import Handler, Registry
from brooq.engine.middleware import Middleware
from brooq.engine.periodic import check_schedule
from brooq.engine.runner import Attempted, SlotRunner
from brooq.engine.store import Store
from brooq.pausing import TopicControls
from brooq.postgres.connect import use_pgbouncer
from brooq.postgres.store import PostgresStore, is_database_source
from brooq.vocabulary import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    Enqueued,
    InvalidJob,
    Job,
    JobRecord,
    KindOptions,
    Schedule,
    Workflow,
    coerce_duration,
    holder_id,
    versions,
)
from brooq.vocabulary.schedule import MissedRuns

if TYPE_CHECKING:  # the types of the sources a Queue takes; psycopg itself stays in postgres/
    import psycopg
    from psycopg_pool import ConnectionPool

H = TypeVar("H", bound=Handler)
M = TypeVar("M", bound=Middleware)
DRAIN_LEASE = timedelta(minutes=5)


@dataclass
class Drained:
    """What :meth:`Queue.drain` ran: attempts in order and a count per outcome label."""

    attempts: list[Attempted] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        """How many attempts ran."""
        return len(self.attempts)


class Queue(TopicControls):
    """A job queue over one PostgreSQL database (or any Store).

    ``source`` is a DSN, a psycopg_pool ConnectionPool, a psycopg Connection,
    or a Store (such as ``brooq.testing.InMemoryStore`` in unit tests). With
    no source the queue uses brooq's settings (``DATABASE_URL`` from the
    environment, ``.env``, ``BROOQ_CONFIG`` or ``$CREDENTIALS_DIRECTORY``), read
    on first use: the app and ``brooq supervise`` then share one source of
    truth for the DSN. Constructing a Queue opens nothing: the first operation
    that needs the database connects (invariant 9). A DSN gets one connection
    used under a lock; give a pool to enqueue from many threads at once.
    ``middleware`` wraps every enqueue and handler run, the first outermost
    (:meth:`use` adds more). ``app_version`` (default: ``QUEUE_APP_VERSION`` from the
    environment; None: unversioned, as before versions) is stamped on every job it enqueues
    (README, "Deploying a new version").
    """

    def __init__(
        self,
        source: str | ConnectionPool | psycopg.Connection[Any] | Store | None = None,
        *,
        notify: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        defaults: KindOptions | None = None,
        pgbouncer: bool = False,
        listen_url: str | None = None,
        middleware: Sequence[Middleware] = (),
        app_version: str | None = None,
    ) -> None:
        self.source = source
        self._app_version = versions.default_app_version(app_version)
        if pgbouncer:
            use_pgbouncer()  # before any connection: they are all opened lazily
        self.notify = notify
        self.max_payload_bytes = max_payload_bytes
        self.max_result_bytes = max_result_bytes
        self.listen_url = listen_url
        self._code_defaults = defaults or KindOptions()
        self.registry = Registry(defaults) if defaults else Registry()
        for item in middleware:
            self.use(item)
        self.schedules: list[Schedule] = []
        self._store: Store | None = None
        if is_database_source(source):
            self._store = PostgresStore(
                source,
                notify=notify,
                max_payload_bytes=max_payload_bytes,
                listen_dsn=listen_url or "auto",
                app_version=self._app_version,
            )
        elif source is not None:
            self._store = cast(Store, source)  # what is left of the union

    @classmethod
    def from_settings(cls, **options: Any) -> Queue:
        """A Queue on ``DATABASE_URL`` from brooq's settings (the same as ``Queue()``).

        Raises ConfigError now when the settings are invalid or name no database.
        """
        queue = cls(**options)
        queue.dsn()
        return queue

    def dsn(self) -> str | None:
        """The DSN this queue connects with: its own, or DATABASE_URL from the settings.

        None when it was given a pool, a connection or a store.
        """
        if isinstance(self.source, str):
            return self.source
        if self.source is not None:
            return None
        from brooq.config import ConfigError, load_settings

        settings = load_settings()
        if settings.pgbouncer:
            use_pgbouncer()
        if not settings.database_url:
            raise ConfigError(
                [
                    "DATABASE_URL: not set; the Queue() without a DSN reads it from the "
                    "environment, .env, BROOQ_CONFIG or $CREDENTIALS_DIRECTORY/database-url"
                ]
            )
        return settings.database_url

    @property
    def store(self) -> Store:
        """The store jobs are written to (built from the settings on first use if needed)."""
        if self._store is None:
            dsn = self.dsn()
            assert dsn is not None
            self._store = PostgresStore(
                dsn,
                notify=self.notify,
                max_payload_bytes=self.max_payload_bytes,
                listen_dsn=self.listen_url or self._settings_listen_dsn(dsn),
                app_version=self._app_version,
            )
        return self._store

    @property
    def app_version(self) -> str | None:
        """The version this queue stamps on the jobs it enqueues (None: unversioned)."""
        return self._app_version

    @app_version.setter
    def app_version(self, version: str | None) -> None:
        # A supervisor sets its own on the app's queue: its handlers' jobs carry it too.
        self._app_version = versions.app_version(version)
        if isinstance(self._store, PostgresStore):
            self._store.app_version = self._app_version

    @staticmethod
    def _settings_listen_dsn(dsn: str) -> str | Literal["auto"] | None:
        """QUEUE_LISTEN_URL from the settings, when the DSN came from them too."""
        from brooq.config import load_settings

        return load_settings().listen_dsn(dsn) or "auto"

    def kind(self, topic: str, **options: Any) -> Callable[[H], H]:
        """Decorator registering a handler for ``topic`` with KindOptions fields.

        ``@queue.kind("email.send", max_attempts=5, attempt_timeout="1m")``.
        Fields: max_attempts, attempt_timeout, max_execution_timeout,
        backoff_base, backoff_max, watchdog_grace, max_running, rate_limit
        (``"100/s"``, ``"30/m"``, ``"5/h"``) and rate_burst. Bad values raise
        InvalidKindOptions here, at registration.
        """
        opts = KindOptions(**options)

        def register(handler: H) -> H:
            self.registry.register(topic, handler, opts)
            return handler

        return register

    def configure(self, defaults: KindOptions) -> None:
        """Take ``defaults`` (from configuration) for every option code leaves unset.

        Options set on a kind, then those given as ``Queue(defaults=…)``, win.
        """
        self.registry.set_defaults(self._code_defaults.with_defaults(defaults))

    def periodic(
        self,
        cron: str,
        *,
        topic: str,
        payload: Any = None,
        name: str = "",
        tz: str = "UTC",
        missed: MissedRuns = "latest",
        priority: int = 0,
    ) -> Schedule:
        """Enqueue a job of ``topic`` at every time the 5-field ``cron`` matches in ``tz``.

        The supervisor enqueues each run exactly once, however many
        supervisors run: each run's idempotency key is derived from ``name``
        (default ``topic@cron``) and the run time. ``missed`` (``latest``,
        ``all`` or ``skip``) says what to do with runs that fell due while no
        supervisor was running.
        """
        schedule = Schedule(
            cron=cron,
            topic=topic,
            payload=payload,
            name=name,
            tz=tz,
            missed=missed,
            priority=priority,
        )
        check_schedule(schedule)
        if any(s.name == schedule.name for s in self.schedules):
            raise InvalidJob(f"a schedule named {schedule.name!r} already exists; pass name=")
        self.schedules.append(schedule)
        return schedule

    def use(self, middleware: M) -> M:
        """Add ``middleware`` (a :class:`brooq.Middleware`) innermost of those added so far,
        for every enqueue of this queue and every run of its handlers; returns it.

        Add it where the queue is made (the module ``--app`` names), so that the
        supervisor and every worker process have it.
        """
        self.registry.middleware.add(middleware)
        return middleware

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """The middleware in order, the outermost first."""
        return self.registry.middleware.all  # type: ignore[return-value]

    def register(self, topic: str, handler: Handler, **options: Any) -> None:
        """Register ``handler`` for ``topic`` without a decorator."""
        self.registry.register(topic, handler, KindOptions(**options))

    def enqueue(self, job: Job, *, conn: psycopg.Connection[Any] | None = None) -> Enqueued:
        """Enqueue one job; returns ``(id, created)``, with the row's ``state`` as ``.state``
        (when ``created`` is False: the existing row's, e.g. ``dead``).

        With ``conn`` the row is written in that connection's open transaction
        and commits or rolls back with it; otherwise it commits at once.
        """
        return self.enqueue_many([job], conn=conn)[0]

    def enqueue_many(
        self, jobs: Sequence[Job], *, conn: psycopg.Connection[Any] | None = None
    ) -> list[Enqueued]:
        """Enqueue jobs in one round trip; one ``(id, created)`` per job, in order."""
        jobs = _checked(jobs)
        stack = self.registry.middleware
        if not stack.by_hook["enqueue"]:
            return self.store.enqueue_many(jobs, conn)
        return stack.enqueue(jobs, lambda given: self.store.enqueue_many(_checked(given), conn))

    def enqueue_workflow(
        self, workflow: Workflow, conn: psycopg.Connection[Any] | None = None
    ) -> list[Enqueued]:
        """Write every job of ``workflow`` (``brooq.Workflow``) and the edges between them in
        one transaction: ``conn``'s open one when given, else one of its own.

        Each job carries ``workflow.id``; a job with parents starts ``waiting`` and becomes
        ``pending`` in the transaction that ends its last parent. A cycle, or a workflow
        enqueued before, raises InvalidJob before anything is written. One Enqueued per job,
        in the order they were added (``created`` is always True).
        """
        if not isinstance(workflow, Workflow):
            raise TypeError(
                f"enqueue_workflow takes a brooq.Workflow, not {type(workflow).__name__}"
            )
        stack = self.registry.middleware
        if not stack.by_hook["enqueue"]:
            return self.store.enqueue_workflow(workflow, conn)
        return stack.enqueue(
            [handle.job for handle in workflow],
            lambda jobs: self.store.enqueue_workflow(workflow.with_jobs(jobs), conn),
        )

    def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> int:
        """Cancel every job of workflow ``workflow_id`` that has not ended (waiting, pending,
        failed, running), in one statement; how many. Running handlers are interrupted by
        their supervisors; jobs outside the workflow that wait for one of these follow
        their own ``if_parent_fails``."""
        return self.store.cancel_workflow(workflow_id, reason)

    async def enqueue_async(self, job: Job, *, conn: psycopg.AsyncConnection[Any]) -> Enqueued:
        """Enqueue one job on an asyncio connection, in its open transaction."""
        return (await self.enqueue_many_async([job], conn=conn))[0]

    async def enqueue_many_async(
        self, jobs: Sequence[Job], *, conn: psycopg.AsyncConnection[Any]
    ) -> list[Enqueued]:
        """Enqueue jobs on an asyncio connection, in its open transaction, in one round trip;
        one ``(id, created)`` per job, in order."""
        jobs = _checked(jobs)
        stack = self.registry.middleware
        if not stack.by_hook["enqueue_async"]:
            return await self.store.enqueue_many_async(jobs, conn)

        async def write(given: list[Job]) -> list[Enqueued]:
            return await self.store.enqueue_many_async(_checked(given), conn)

        return await stack.enqueue_async(jobs, write)

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a job; True if canceled now, False if already terminal; JobNotFound if unknown.

        A running handler is interrupted by its supervisor; the row stays
        ``canceled`` whatever the handler does next.
        """
        return self.store.cancel(job_id, reason)

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """What the handler of job ``job_id`` returned (decoded JSON; None when it returned
        nothing), once the job is ``done``.

        While the job is pending, failed and waiting for its retry, or running, this waits
        up to ``timeout`` seconds (None: as long as it takes), woken by the supervisor's
        one NOTIFY per batch of outcomes (or, through a transaction-pooling PgBouncer
        without QUEUE_LISTEN_URL, by reading the row every second), then raises
        ``brooq.ResultTimeout``. A job that ended without success raises
        ``brooq.JobDead`` or ``brooq.JobCanceled`` (both ``brooq.JobFailed``, with the
        job's ``last_error``); an unknown or retained-away id ``brooq.JobNotFound``.
        The wait holds a connection of its own, never one idle in a transaction.
        """
        return self.store.result(job_id, timeout)

    async def result_async(self, job_id: str, timeout: float | None = None) -> Any:
        """:meth:`result` for asyncio apps: the same, awaited, never blocking the loop."""
        return await self.store.result_async(job_id, timeout)

    def get(self, job_id: str) -> JobRecord:
        """The job's row (its whole fate). Raises JobNotFound."""
        return self.store.get(job_id)

    def drain(
        self,
        *,
        topics: Sequence[str] | None = None,
        max_jobs: int = 10_000,
        lease: timedelta | str | float = DRAIN_LEASE,
    ) -> Drained:
        """Run ready jobs inline, in this thread, until none is ready (for tests and scripts).

        Jobs retried with a backoff are not ready yet, so drain stops before
        them. Soft attempt timeouts apply when called from the main thread.
        """
        runner = SlotRunner(
            self.store,
            self.registry,
            holder=holder_id(),
            lease=coerce_duration(lease, name="lease"),
            topics=topics,
            max_result_bytes=self.max_result_bytes,
        )
        drained = Drained()
        try:
            while drained.total < max_jobs:
                attempted = runner.run_once()
                if attempted is None:
                    break
                drained.attempts.append(attempted)
                drained.outcomes[attempted.outcome.label] += 1
        finally:
            runner.close()
        return drained

    def close(self) -> None:
        """Close the connection the queue opened itself (a given pool or connection stays open)."""
        close = getattr(self._store, "close", None)
        if close is not None:
            close()


def _checked(jobs: Sequence[Job]) -> list[Job]:
    """``jobs`` as a list; TypeError for anything that is not a Job."""
    jobs = list(jobs)
    for job in jobs:
        if not isinstance(job, Job):
            raise TypeError(f"enqueue takes brooq.Job values, not {type(job).__name__}")
    return jobs
