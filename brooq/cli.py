"""The ``brooq`` command: migrate, enqueue, inspect, cancel, configure, work.

Exit codes: 0 success; 1 an operation failed (unknown job, database down);
2 bad input or configuration (every problem listed, one per line).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from brooq import __version__
from brooq.config import ConfigError, Settings, load_settings, settings_to_env, settings_to_toml
from brooq.logs import setup_logging
from brooq.vocabulary import (
    BrooqError,
    InvalidJob,
    InvalidKindOptions,
    InvalidTopic,
    Job,
    JobNotFound,
    KindOptions,
    coerce_duration,
    format_duration,
    parse_duration,
)

log = logging.getLogger("brooq.cli")


class UsageError(BrooqError):
    """The command line asks for something impossible; exit code 2."""


Command = Callable[[argparse.Namespace, Settings], int]


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {key: getattr(args, attr, None) for attr, key in _FLAG_KEYS.items()}
    settings = load_settings(env_file=args.env_file, toml_file=args.config,
                             overrides={k: v for k, v in overrides.items() if v is not None})
    for warning in settings.warnings:
        print(f"brooq: warning: {warning}", file=sys.stderr)
    return settings


_FLAG_KEYS = {
    "lease": "QUEUE_LEASE", "poll_interval": "QUEUE_POLL_INTERVAL",
    "max_jobs_per_worker": "QUEUE_MAX_JOBS_PER_WORKER",
    "max_memory_per_worker": "QUEUE_MAX_MEMORY_PER_WORKER",
    "watchdog_grace": "QUEUE_WATCHDOG_GRACE", "http_addr": "HTTP_ADDR",
    "log_format": "LOG_FORMAT", "log_level": "LOG_LEVEL",
}


def _dsn(settings: Settings) -> str:
    if not settings.database_url:
        raise UsageError(
            "DATABASE_URL is not set; set it in the environment, .env, the TOML file "
            "or $CREDENTIALS_DIRECTORY/database-url"
        )
    return settings.database_url


def _store(settings: Settings) -> Any:
    from brooq.postgres.store import PostgresStore

    return PostgresStore(_dsn(settings), notify=settings.notify,
                         max_payload_bytes=settings.max_payload_bytes)


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=str, ensure_ascii=False))


# --- migrate ------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply, roll back or list the schema migrations."""
    from brooq.postgres import migrations

    logging.getLogger("yoyo").setLevel(logging.WARNING)  # we print what was applied ourselves
    dsn = _dsn(settings)
    if args.action == "up":
        applied = migrations.up(dsn)
        print("\n".join(f"applied {m}" for m in applied) or "up to date")
    elif args.action == "down":
        rolled = migrations.down(dsn, steps=None if args.all else args.steps)
        print("\n".join(f"rolled back {m}" for m in rolled) or "nothing to roll back")
    else:
        for status in migrations.status(dsn):
            print(f"{'applied' if status.applied else 'pending':8} {status.id}")
    return 0


# --- enqueue / job / cancel -----------------------------------------------------


def parse_at(text: str, now: datetime | None = None) -> datetime:
    """``--at``: an ISO 8601 time with a zone, or a duration with units meaning "from now"."""
    now = now or datetime.now(UTC)
    try:
        return now + parse_duration(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--at {text!r} is neither an ISO 8601 time (2026-12-24T18:00:00+00:00) "
            "nor a delay with units (30s, 5m, 2h)"
        ) from None
    if at.tzinfo is None:
        raise UsageError(f"--at {text!r} has no time zone; add one, e.g. {text}+00:00 or {text}Z")
    return at


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    """Enqueue one job; print ``{"id": …, "created": …}``."""
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--payload is not valid JSON: {exc}") from None
    at = parse_at(args.at) if args.at else None
    job = Job(topic=args.topic, payload=payload, idempotency_key=args.key, available_at=at)
    store = _store(settings)
    try:
        (result,) = store.enqueue_many([job])
    finally:
        store.close()
    _print_json({"id": result.id, "created": result.created})
    return 0


def cmd_job(args: argparse.Namespace, settings: Settings) -> int:
    """Show the whole fate of one job."""
    store = _store(settings)
    try:
        record = store.get(args.id)
    finally:
        store.close()
    row = record.as_dict()
    if args.json:
        _print_json(row)
        return 0
    width = max(len(k) for k in row)
    for key, value in row.items():
        shown = json.dumps(value, ensure_ascii=False) if key == "payload" else value
        print(f"{key:<{width}}  {'' if shown is None else shown}")
    return 0


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel a job that is not terminal yet."""
    store = _store(settings)
    try:
        canceled = store.cancel(args.id, args.reason)
        state = store.get(args.id).state
    finally:
        store.close()
    if canceled:
        print(f"canceled {args.id}")
        return 0
    print(f"job {args.id} is already {state}; nothing changed", file=sys.stderr)
    return 1


# --- status -----------------------------------------------------------------------

_STATES = ("pending", "failed", "processing", "done", "dead", "canceled")
_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    """Depth, lag, running jobs and recent deaths; once, or redrawn every ``--watch`` s."""
    queue = None
    if args.app:
        from brooq.app import load_app

        queue = load_app(args.app)
    store = _store(settings)
    try:
        if args.watch is None:
            _show_status(_status_snapshot(store, queue), args.json)
            return 0
        return _watch_status(store, args.watch, args.json, queue)
    finally:
        store.close()


def _status_snapshot(store: Any, queue: Any = None) -> dict[str, Any]:
    """Every section of ``brooq status`` as JSON-friendly values."""
    running = [{**row, "id": str(row["id"]), "lease_left_s": _seconds(row["lease_left_s"])}
               for row in store.running()]
    dead = [{**row, "id": str(row["id"]), "updated_at": row["updated_at"].isoformat()}
            for row in store.recent_dead(timedelta(hours=1))]
    snapshot = {
        "taken_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "depth": store.depth(), "oldest_ready_s": store.oldest_ready(),
        "running": running, "dead_last_hour": dead,
    }
    if queue is not None:
        from brooq.schedules_view import schedules_table

        snapshot["schedules"] = schedules_table(queue)
    return snapshot


def _seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _show_status(snapshot: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(snapshot)
    else:
        print(_render_status(snapshot))


def _watch_seconds(text: str) -> float:
    """``--watch SECONDS``: a positive number of seconds (a bare number here, like watch(1))."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.1 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in [0.1, 86400]")
    return seconds


def _watch_status(store: Any, interval: float, as_json: bool, queue: Any = None) -> int:
    """Redraw until SIGINT (exit 0); a database outage is shown, not fatal."""
    import time

    try:
        while True:
            try:
                snapshot: dict[str, Any] | None = _status_snapshot(store, queue)
                error = None
            except BrooqError as exc:
                snapshot, error = None, str(exc)
            _redraw(snapshot, error, interval, as_json)
            time.sleep(interval)
    except KeyboardInterrupt:
        if not as_json:
            print()
        return 0


def _redraw(snapshot: dict[str, Any] | None, error: str | None, interval: float,
            as_json: bool) -> None:
    if as_json:
        _print_json(snapshot if snapshot is not None else {"error": error})
    else:
        body = _render_status(snapshot) if snapshot is not None else f"brooq: error: {error}"
        sys.stdout.write(f"{_CLEAR}{body}\n\n(every {interval:g}s; Ctrl-C to quit)\n")
    sys.stdout.flush()


def _render_status(snapshot: dict[str, Any]) -> str:
    """The text form: one block per section."""
    blocks = [f"brooq status at {snapshot['taken_at']}",
              _render_depth(snapshot["depth"], snapshot["oldest_ready_s"]),
              _render_running(snapshot["running"]),
              _render_dead(snapshot["dead_last_hour"])]
    if "schedules" in snapshot:
        from brooq.schedules_view import render_schedules

        blocks.append(render_schedules(snapshot["schedules"]))
    return "\n\n".join(blocks)


def _age(seconds: float | None) -> str:
    if not seconds:
        return "0s"
    return format_duration(timedelta(seconds=round(seconds)) if seconds >= 1
                           else timedelta(milliseconds=round(seconds * 1000)))


def _render_depth(rows: list[dict[str, Any]], oldest: dict[str, float]) -> str:
    if not rows:
        return "no jobs"
    by_topic: dict[str, dict[str, int]] = {}
    for row in rows:
        by_topic.setdefault(row["topic"], {})[row["state"]] = row["jobs"]
    width = max(len("topic"), *(len(t) for t in by_topic))
    head = f"{'topic':<{width}} " + " ".join(f"{s:>10}" for s in _STATES) + "  oldest ready"
    lines = [head]
    for topic, counts in sorted(by_topic.items()):
        cells = " ".join(f"{counts.get(s, 0):>10}" for s in _STATES)
        lines.append(f"{topic:<{width}} {cells}  {_age(oldest.get(topic)):>12}")
    return "\n".join(lines)


def _render_running(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "running: none"
    lines = [f"running: {len(rows)}",
             f"  {'job':<36}  {'topic':<20} {'attempt':>7}  {'lease left':>10}  holder"]
    for row in rows:
        left = row["lease_left_s"]
        shown = "expired" if left is not None and left < 0 else _age(left)
        lines.append(f"  {row['id']:<36}  {row['topic']:<20} {row['attempts']:>7}  "
                     f"{shown:>10}  {row['locked_by'] or '-'}")
    return "\n".join(lines)


def _render_dead(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "dead in the last hour: none"
    lines = [f"dead in the last hour: {len(rows)}",
             f"  {'job':<36}  {'topic':<20} {'attempts':>8}  {'at (UTC)':<19}  last error"]
    for row in rows:
        at = datetime.fromisoformat(row["updated_at"]).astimezone(UTC)
        error = (row["last_error"] or "").replace("\n", " ")
        error = error if len(error) <= 60 else error[:59] + "…"
        lines.append(f"  {row['id']:<36}  {row['topic']:<20} {row['attempts']:>8}  "
                     f"{at:%Y-%m-%d %H:%M:%S}  {error}")
    return "\n".join(lines)


# --- config ---------------------------------------------------------------------------


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """Print the effective configuration, secrets redacted."""
    print(settings_to_toml(settings) if args.format == "toml" else settings_to_env(settings),
          end="")
    return 0


# --- work -------------------------------------------------------------------------------


def cmd_work(args: argparse.Namespace, settings: Settings) -> int:
    """Run one slot in the foreground until SIGTERM/SIGINT."""
    from brooq.app import load_app
    from brooq.inprocess import InProcessWorker, WorkerConfig

    queue = load_app(args.app)
    queue.configure(_kind_defaults(settings))
    topics = _topics(args.topics, queue.registry.topics())
    config = WorkerConfig(
        dsn=settings.database_url or _queue_dsn(queue), lease=settings.lease,
        poll_interval=settings.poll_interval, reaper_period=settings.reaper_period,
        retention_ttl=settings.retention_ttl, retention_batch=settings.retention_batch,
        retention_period=settings.retention_period, topics=topics,
        max_jobs=args.max_jobs, exit_when_idle=args.exit_when_idle,
    )
    return InProcessWorker(queue, config).run()


def cmd_supervise(args: argparse.Namespace, settings: Settings) -> int:
    """Fork the worker processes and supervise them until SIGTERM/SIGINT/SIGQUIT."""
    from brooq import metrics
    from brooq.app import load_app

    directory = metrics.create_directory()  # before the app can create any metric
    try:
        return _supervise(args, settings, load_app(args.app))
    finally:
        metrics.remove_directory(directory)


def _supervise(args: argparse.Namespace, settings: Settings, queue: Any) -> int:
    from brooq.metrics import Metrics
    from brooq.supervisor.arbiter import Supervisor, SupervisorConfig
    from brooq.supervisor.slots import parse_slots


    queue.configure(_kind_defaults(settings))
    served = _topics(args.topics, queue.registry.topics())
    slots = parse_slots(args.workers or str(settings.workers), served, queue.registry.topics())
    graceful = coerce_duration(args.graceful_timeout, name="--graceful-timeout")
    config = SupervisorConfig(
        slots=slots, dsn=settings.database_url or _queue_dsn(queue), lease=settings.lease,
        poll_interval=settings.poll_interval, reaper_period=settings.reaper_period,
        retention_ttl=settings.retention_ttl, retention_batch=settings.retention_batch,
        retention_period=settings.retention_period, graceful_timeout=graceful,
        max_jobs_per_worker=settings.max_jobs_per_worker,
        max_memory_per_worker=settings.max_memory_per_worker, notify=settings.notify,
        max_payload_bytes=settings.max_payload_bytes, name=args.app,
        http_addr=settings.http_addr,
        http_allow_remote=args.http_allow_remote, token=settings.token,
    )
    return Supervisor(queue, config, Metrics()).run()


def _kind_defaults(settings: Settings) -> KindOptions:
    return KindOptions(**settings.kind_defaults(), watchdog_grace=settings.watchdog_grace)


def _queue_dsn(queue: Any) -> str:
    if isinstance(queue.source, str):
        return str(queue.source)
    raise UsageError("DATABASE_URL is not set and the app's Queue was not built from a DSN")


def _topics(given: str | None, registered: Sequence[str]) -> list[str]:
    if not given:
        return list(registered)
    topics = [t.strip() for t in given.split(",") if t.strip()]
    unknown = [t for t in topics if t not in registered]
    if unknown:
        raise UsageError(
            f"--topics names topics the app does not handle: {', '.join(unknown)}; "
            f"it handles: {', '.join(registered)}"
        )
    return topics


# --- parser -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brooq", description="brooq: a PostgreSQL-backed job queue.",
        epilog="Configuration: environment, .env, --config TOML, flags. See `brooq config show`.",
    )
    parser.add_argument("--version", action="version", version=f"brooq {__version__}")
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument("--env-file", default=".env", metavar="FILE",
                        help="dotenv file to read (default: .env when present)")
    parser.add_argument("--log-format", choices=["kv", "json"], help="log line format")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_migrate(sub)
    _add_jobs(sub)
    _add_work(sub)
    return parser


def _add_migrate(sub: Any) -> None:
    p = sub.add_parser("migrate", help="apply, roll back or list schema migrations")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--steps", type=int, default=1, help="down: how many to roll back (default 1)")
    p.add_argument("--all", action="store_true", help="down: roll back every migration")
    p.set_defaults(func=cmd_migrate)


def _add_jobs(sub: Any) -> None:
    p = sub.add_parser("enqueue", help="enqueue one job and print its id")
    p.add_argument("--topic", required=True)
    p.add_argument("--payload", default="null", help="JSON payload (default: null)")
    p.add_argument("--key", help="idempotency key (per topic)")
    p.add_argument("--at", help="ISO 8601 time with zone, or a delay like 30s")
    p.set_defaults(func=cmd_enqueue)
    p = sub.add_parser("job", help="show a job's row: its whole fate")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_job)
    p = sub.add_parser("cancel", help="cancel a pending, failed or running job")
    p.add_argument("id")
    p.add_argument("--reason")
    p.set_defaults(func=cmd_cancel)
    p = sub.add_parser("status", help="depth, oldest ready age, running and dead jobs")
    p.add_argument("--json", action="store_true", help="one JSON object (a line per refresh)")
    p.add_argument("--watch", nargs="?", const=2.0, type=_watch_seconds, metavar="SECONDS",
                   help="redraw every SECONDS (default 2) until Ctrl-C")
    p.add_argument("--app", metavar="MODULE:QUEUE",
                   help="also list the app's periodic schedules and their next run")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("config", help="print the effective configuration")
    p.add_argument("action", choices=["show"])
    p.add_argument("--format", choices=["env", "toml"], default="env")
    p.set_defaults(func=cmd_config)


def _add_work(sub: Any) -> None:
    p = sub.add_parser("work", help="run one job slot in this process until SIGTERM/SIGINT")
    p.add_argument("--app", required=True, metavar="MODULE:QUEUE")
    p.add_argument("--topics", help="comma-separated topics to serve (default: all of the app's)")
    p.add_argument("--lease", help="lease duration, e.g. 2m")
    p.add_argument("--poll-interval", help="idle poll interval, e.g. 1s")
    p.add_argument("--max-jobs", type=int, default=0, help="exit after this many attempts")
    p.add_argument("--exit-when-idle", action="store_true",
                   help="exit when no job is ready (scripts, tests)")
    p.set_defaults(func=cmd_work)
    p = sub.add_parser("supervise", help="fork N worker processes and supervise them")
    p.add_argument("--app", required=True, metavar="MODULE:QUEUE")
    p.add_argument("--workers", help="a count (8) or topic=count pairs (email.send=4,report=2); "
                   "default QUEUE_WORKERS")
    p.add_argument("--topics", help="comma-separated topics this supervisor serves")
    p.add_argument("--graceful-timeout", default="30s",
                   help="on SIGTERM, how long running jobs may finish (default 30s)")
    p.add_argument("--max-jobs-per-worker", help="recycle a worker after this many jobs")
    p.add_argument("--max-memory-per-worker", help="recycle a worker above this RSS, e.g. 512MiB")
    p.add_argument("--watchdog-grace", help="how long an interrupted handler may take to exit")
    p.add_argument("--http-addr", help="address of /metrics and /healthz (default HTTP_ADDR, "
                   "127.0.0.1:8090; port 0 picks a free one)")
    p.add_argument("--http-allow-remote", action="store_true",
                   help="allow a non-loopback HTTP_ADDR (a token is then required)")
    p.add_argument("--lease", help="lease duration, e.g. 2m")
    p.add_argument("--poll-interval", help="idle poll interval, e.g. 1s")
    p.set_defaults(func=cmd_supervise)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"brooq: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``brooq`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
        setup_logging(settings.log_format, settings.log_level)
        code: int = args.func(args, settings)
        return code
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"brooq: config: {problem}", file=sys.stderr)
        return 2
    except (UsageError, InvalidJob, InvalidTopic, InvalidKindOptions, ValueError) as exc:
        print(f"brooq: error: {exc}", file=sys.stderr)
        return 2
    except JobNotFound as exc:
        print(f"brooq: error: {exc}", file=sys.stderr)
        return 1
    except BrooqError as exc:
        code = 2 if type(exc).__name__ == "AppLoadError" else 1
        print(f"brooq: error: {exc}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
