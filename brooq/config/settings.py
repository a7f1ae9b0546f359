"""Every setting of brooq, declared once: the table that `Settings`, the flags, the help,
`config show` and `.env.example` are all made from.

Adding a setting is one `Key` line here plus its use. A key holds its
environment name, kind (syntax and bounds), default, help text, section, the
commands whose flag sets it, and whether it is secret (never shown, never a
flag). Read values as attributes of a `Settings`: ``settings.lease``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Generic, Literal, TypedDict, TypeVar, overload

from brooq.config import values as v
from brooq.postgres.dsn import REDACTED, redact_dsn
from brooq.vocabulary import KindOptions
from brooq.vocabulary.durations import format_duration

T = TypeVar("T")
LogFormat = Literal["kv", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]

WORK = "work"
SUPERVISE = "supervise"
DASHBOARD = "dashboard"
GLOBAL = "global"
"""A flag of the top-level parser (``brooq --log-format json …``)."""

_MIN_REAPER_PERIOD = timedelta(seconds=5)
_AUTO_RETENTION_PERIOD = timedelta(minutes=5)


class KindDefaults(TypedDict):
    """Per-kind options that apply when a ``@queue.kind(...)`` call leaves them out."""

    max_attempts: int
    attempt_timeout: timedelta
    max_execution_timeout: timedelta
    backoff_base: timedelta
    backoff_max: timedelta


class Key(Generic[T]):
    """One setting. As a class attribute of `Settings` it reads the value of an instance."""

    def __init__(
        self,
        env: str,
        kind: v.Kind[Any],
        default: str | None,
        help: str,
        *,
        section: str,
        example: str = "",
        secret: bool = False,
        commands: tuple[str, ...] = (),
        computed: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> None:
        self.env, self.kind, self.default, self.help = env, kind, default, help
        self.section, self.example, self.secret = section, example, secret
        # Secrets never become flags: a command line is visible to every local user (ps).
        self.commands = () if secret else commands
        self.computed = computed
        self.attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name

    @overload
    def __get__(self, obj: None, owner: type) -> Key[T]: ...

    @overload
    def __get__(self, obj: Settings, owner: type) -> T: ...

    def __get__(self, obj: Settings | None, owner: type) -> Key[T] | T:
        if obj is None:
            return self
        value: T = obj._values[self.attr]
        return value

    @property
    def toml(self) -> str:
        """The key's TOML spelling: lowercase, without the QUEUE_ prefix."""
        return self.env.lower().removeprefix("queue_")

    @property
    def flag(self) -> str:
        """The command-line flag: ``--`` and the attribute with dashes."""
        return "--" + self.attr.replace("_", "-")

    def parse(self, text: str) -> Any:
        """The value of ``text``; ValueError saying what to write instead."""
        return self.kind.parse(text, self.example or self.default or "")

    def shown(self, value: Any) -> str | None:
        """The value as ``config show`` prints it: secrets redacted, None when unset."""
        if value is None:
            return None
        if self.secret:
            return redact_dsn(value) if self.kind is v.DSN else REDACTED
        return self.kind.show(value)


def _reaper_period(values: Mapping[str, Any]) -> timedelta:
    lease: timedelta = values["lease"]
    return max(_MIN_REAPER_PERIOD, lease / 4)


class Settings:
    """Validated, immutable settings. Durations are ``timedelta``, sizes int bytes.

    Build it with `brooq.config.load_settings()`. Zero means "unlimited" for
    ``max_jobs_per_worker`` and ``max_memory_per_worker`` and "disabled" for
    ``retention_ttl``. ``warnings`` (unknown keys) and ``sources`` (env name →
    default, toml, .env, env, credentials, cli or computed) do not take part in
    equality. ``repr()`` redacts secrets.
    """

    # Table order is the order problems are reported in; .env.example groups by section.
    database_url: Key[str | None] = Key(
        "DATABASE_URL",
        v.DSN,
        None,
        "PostgreSQL URL or libpq key=value string (secret: its password is never logged).",
        section="secrets",
        example="postgresql://user@localhost:5432/app",
        secret=True,
    )
    listen_url: Key[str | None] = Key(
        "QUEUE_LISTEN_URL",
        v.DSN,
        None,
        "Direct PostgreSQL URL for LISTEN (a session of its own), for when DATABASE_URL goes "
        "through a transaction-pooling PgBouncer. Empty: LISTEN on DATABASE_URL, or with "
        "QUEUE_PGBOUNCER no LISTEN at all (look for jobs every QUEUE_POLL_INTERVAL).",
        section="secrets",
        example="postgresql://user@db-host:5432/app",
        secret=True,
    )
    pgbouncer: Key[bool] = Key(
        "QUEUE_PGBOUNCER",
        v.BOOL,
        "false",
        "DATABASE_URL goes through PgBouncer in transaction mode: no server-side prepared "
        "statements, no session settings (statement_timeout by SET LOCAL), no LISTEN but on "
        "QUEUE_LISTEN_URL (true/false).",
        section="connections",
    )
    workers: Key[int | str] = Key(
        "QUEUE_WORKERS",
        v.WORKERS,
        "2",
        "Worker processes of a supervisor: a count (8) or topic=count pairs "
        "(email.send=4,report=2).",
        section="workers",
        commands=(SUPERVISE,),
    )
    topics: Key[tuple[str, ...] | None] = Key(
        "QUEUE_TOPICS",
        v.TOPICS,
        None,
        "Comma-separated topics to serve. Empty: every topic the app handles.",
        section="workers",
        example="email.send,report",
        commands=(WORK, SUPERVISE),
    )
    poll_interval: Key[timedelta] = Key(
        "QUEUE_POLL_INTERVAL",
        v.duration(zero_ok=False),
        "1s",
        "How often idle workers look for jobs when no NOTIFY wakes them.",
        section="workers",
        commands=(WORK, SUPERVISE),
    )
    lease: Key[timedelta] = Key(
        "QUEUE_LEASE",
        v.duration(zero_ok=False),
        "2m",
        "Lease of a claimed job, extended every lease/3 while it runs; how long a job of a "
        "dead host waits before the reaper returns it.",
        section="workers",
        commands=(WORK, SUPERVISE),
    )
    attempt_timeout: Key[timedelta] = Key(
        "QUEUE_ATTEMPT_TIMEOUT",
        v.duration(zero_ok=False),
        "1m",
        "Soft timeout of an attempt: brooq.AttemptTimedOut is raised in the handler.",
        section="kinds",
    )
    max_execution_timeout: Key[timedelta] = Key(
        "QUEUE_MAX_EXECUTION_TIMEOUT",
        v.duration(zero_ok=False),
        "5m",
        "Hard limit of an attempt: the supervisor SIGKILLs the worker (a recorded failure).",
        section="kinds",
    )
    backoff_base: Key[timedelta] = Key(
        "QUEUE_BACKOFF_BASE",
        v.duration(zero_ok=False),
        "1s",
        "Retry backoff: d = min(base * 2^(attempt-1), max), the delay uniform in [d/2, d].",
        section="kinds",
    )
    backoff_max: Key[timedelta] = Key(
        "QUEUE_BACKOFF_MAX",
        v.duration(zero_ok=False),
        "1m",
        "The longest retry backoff (and the longest brooq.Delay).",
        section="kinds",
    )
    max_attempts: Key[int] = Key(
        "QUEUE_MAX_ATTEMPTS",
        v.integer(1, 1_000_000),
        "5",
        "Charged attempts (lease expiries do not count) before a failing job goes dead.",
        section="kinds",
    )
    reaper_period: Key[timedelta] = Key(
        "QUEUE_REAPER_PERIOD",
        v.duration(zero_ok=False),
        None,
        "How often expired leases go back to pending. Empty: max(5s, lease/4).",
        section="maintenance",
        example="30s, or leave it unset for max(5s, lease/4)",
        computed=_reaper_period,
    )
    max_expirations: Key[int] = Key(
        "QUEUE_MAX_EXPIRATIONS",
        v.integer(0, 1_000_000),
        "5",
        "A job whose lease expired this many times in a row (its holder died every time it "
        "ran: it may be killing its host) is moved to dead by the reaper (0 = never).",
        section="maintenance",
        example="5, or 0 for never",
    )
    retention_ttl: Key[timedelta] = Key(
        "QUEUE_RETENTION_TTL",
        v.duration(zero_ok=True),
        "720h",
        "Terminal rows (done, dead, canceled) older than this are deleted; 0 disables "
        "retention. It is also the idempotency window: a key is free again once its row is gone.",
        section="maintenance",
        example="720h, or 0 to disable retention",
    )
    retention_batch: Key[int] = Key(
        "QUEUE_RETENTION_BATCH",
        v.integer(1, 1_000_000),
        "1000",
        "Rows deleted per retention transaction.",
        section="maintenance",
    )
    retention_period: Key[timedelta] = Key(
        "QUEUE_RETENTION_PERIOD",
        v.duration(zero_ok=True),
        "0",
        "How often retention runs (0 = automatic: 5m).",
        section="maintenance",
        example="5m, or 0 for automatic",
        computed=lambda values: _AUTO_RETENTION_PERIOD,
    )
    watchdog_grace: Key[timedelta] = Key(
        "QUEUE_WATCHDOG_GRACE",
        v.duration(zero_ok=False),
        None,
        "How long an interrupted handler (timeout, cancel, lease lost) may take to exit "
        "before SIGKILL. Empty: the lease.",
        section="workers",
        example="1m, or leave it unset to use the lease",
        commands=(SUPERVISE,),
        computed=lambda values: values["lease"],
    )
    max_jobs_per_worker: Key[int] = Key(
        "QUEUE_MAX_JOBS_PER_WORKER",
        v.integer(0),
        "0",
        "Recycle a worker process after this many jobs (0 = never).",
        section="workers",
        example="1000, or 0 for unlimited",
        commands=(SUPERVISE,),
    )
    max_memory_per_worker: Key[int] = Key(
        "QUEUE_MAX_MEMORY_PER_WORKER",
        v.size(zero_ok=True),
        "0",
        "Recycle a worker process above this resident size, between jobs (0 = no limit).",
        section="workers",
        example="512MiB, or 0 for unlimited",
        commands=(SUPERVISE,),
    )
    prefetch: Key[int | None] = Key(
        "QUEUE_PREFETCH",
        v.integer(0, 10_000),
        None,
        "Jobs a supervisor claims ahead of its idle workers, so a worker that finishes gets "
        "its next job without waiting for the database. Empty: the number of workers; 0: "
        "claim only for idle workers.",
        section="workers",
        example="8, or 0",
        commands=(SUPERVISE,),
    )
    graceful_timeout: Key[timedelta] = Key(
        "QUEUE_GRACEFUL_TIMEOUT",
        v.duration(zero_ok=True),
        "30s",
        "On SIGTERM, how long running jobs may finish before their workers are killed "
        "(their jobs go back to pending, uncharged).",
        section="workers",
        commands=(SUPERVISE,),
    )
    max_payload_bytes: Key[int] = Key(
        "QUEUE_MAX_PAYLOAD_BYTES",
        v.size(zero_ok=False),
        "1MiB",
        "Largest accepted payload (encoded JSON).",
        section="enqueue",
    )
    notify: Key[bool] = Key(
        "QUEUE_NOTIFY",
        v.BOOL,
        "true",
        "NOTIFY on enqueue so idle workers wake at once (true/false).",
        section="enqueue",
    )
    http_addr: Key[str] = Key(
        "HTTP_ADDR",
        v.ADDR,
        "127.0.0.1:8090",
        "Address of /metrics, /healthz and the dashboard (loopback only unless "
        "HTTP_ALLOW_REMOTE; port 0 = any free).",
        section="surface",
        commands=(SUPERVISE, DASHBOARD),
    )
    http_allow_remote: Key[bool] = Key(
        "HTTP_ALLOW_REMOTE",
        v.BOOL,
        "false",
        "Allow a non-loopback HTTP_ADDR (BROOQ_TOKEN of at least 32 bytes then required).",
        section="surface",
        commands=(SUPERVISE, DASHBOARD),
    )
    token: Key[str | None] = Key(
        "BROOQ_TOKEN",
        v.TEXT,
        None,
        "Bearer token of the job endpoints and dashboard actions (secret). Unset: those "
        "endpoints are off and the dashboard is read-only; /metrics and /healthz never need it.",
        section="secrets",
        secret=True,
    )
    log_format: Key[LogFormat] = Key(
        "LOG_FORMAT",
        v.choice("kv", "json"),
        "kv",
        "Log lines as kv (key=value) or json.",
        section="surface",
        commands=(GLOBAL,),
    )
    log_level: Key[LogLevel] = Key(
        "LOG_LEVEL",
        v.choice("debug", "info", "warning", "error"),
        "info",
        "debug, info, warning or error.",
        section="surface",
        commands=(GLOBAL,),
    )
    log_jobs: Key[bool] = Key(
        "QUEUE_LOG_JOBS",
        v.BOOL,
        "false",
        "Log every job at INFO (JobClaimed, JobDone); off, done jobs are logged at DEBUG "
        "(their row and the metrics record them) and failures are logged either way.",
        section="surface",
        commands=(SUPERVISE, WORK),
    )

    def __init__(
        self,
        values: Mapping[str, Any],
        warnings: tuple[str, ...] = (),
        sources: Mapping[str, str] | None = None,
    ) -> None:
        missing = {key.attr for key in KEYS} - set(values)
        if missing:
            raise TypeError(f"Settings needs a value for {', '.join(sorted(missing))}")
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "warnings", tuple(warnings))
        object.__setattr__(self, "sources", dict(sources or {}))

    _values: dict[str, Any]
    warnings: tuple[str, ...]
    sources: dict[str, str]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Settings are immutable; use replace()")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self._values.items())))

    def __repr__(self) -> str:
        shown = ", ".join(f"{key.attr}={self._repr(key)}" for key in KEYS)
        return f"Settings({shown})"

    def _repr(self, key: Key[Any]) -> str:
        value = self._values[key.attr]
        return repr(key.shown(value) if key.secret else value)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (attribute names) applied; not validated again."""
        unknown = set(changes) - {key.attr for key in KEYS}
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        return Settings({**self._values, **changes}, self.warnings, self.sources)

    def items(self) -> Iterator[tuple[Key[Any], Any]]:
        """Each key with its value, in table order."""
        for key in KEYS:
            yield key, self._values[key.attr]

    def kind_defaults(self) -> KindDefaults:
        """The kind options the settings hold, by name."""
        return KindDefaults(
            max_attempts=self.max_attempts,
            attempt_timeout=self.attempt_timeout,
            max_execution_timeout=self.max_execution_timeout,
            backoff_base=self.backoff_base,
            backoff_max=self.backoff_max,
        )

    def listen_dsn(self, dsn: str) -> str | None:
        """Where LISTEN connects: QUEUE_LISTEN_URL, else ``dsn`` unless it is a bouncer's."""
        if self.listen_url:
            return self.listen_url
        return None if self.pgbouncer else dsn

    def kind_options(self) -> KindOptions:
        """Defaults for every kind option that the handler's code does not set."""
        return KindOptions(**self.kind_defaults(), watchdog_grace=self.watchdog_grace)


KEYS: tuple[Key[Any], ...] = tuple(k for k in vars(Settings).values() if isinstance(k, Key))
"""Every setting, in table order (the order of `config show` and `.env.example`)."""
BY_ENV = {key.env: key for key in KEYS}
BY_ATTR = {key.attr: key for key in KEYS}
BY_NAME = {**BY_ENV, **{key.toml: key for key in KEYS}}
"""Both spellings are accepted in TOML and in overrides: QUEUE_LEASE and lease."""
ORDERED = (("attempt_timeout", "max_execution_timeout"), ("backoff_base", "backoff_max"))
"""A soft timeout above the hard one, or a base above the cap, can never take effect."""
SECTIONS = {
    "secrets": "secrets (placeholders)",
    "connections": "connections",
    "workers": "workers",
    "kinds": "defaults of every kind option that code does not set",
    "maintenance": "maintenance (run by every supervisor)",
    "enqueue": "enqueue",
    "surface": "service surface and logs",
}


def order_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(env name, problem) for each ORDERED pair whose values are the wrong way round."""
    out = []
    for low, high in ORDERED:
        small, big = values.get(low), values.get(high)
        if isinstance(small, timedelta) and isinstance(big, timedelta) and small > big:
            low_env, high_env = BY_ATTR[low].env, BY_ATTR[high].env
            out.append(
                (
                    low_env,
                    f"{format_duration(small)} is longer than {high_env} "
                    f"({format_duration(big)}); write at most {format_duration(big)} "
                    f"or raise {high_env}",
                )
            )
    return out
