"""``brooq work`` and ``brooq supervise``: run the app's handlers."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import Any

from brooq.cli.common import add_setting_flags
from brooq.cli.errors import UsageError
from brooq.config import Settings
from brooq.config.settings import SUPERVISE, WORK
from brooq.vocabulary import StoreUnavailable

SUPERVISOR_CONNECTIONS = 3
"""Connections a supervisor opens for itself, whatever its workers: two database lanes, LISTEN."""
SURFACE_CONNECTIONS = 4
"""More when HTTP_ADDR is on: job endpoints, metrics gauges, the dashboard's reads and writes
(each opened at its first request)."""


def register(sub: Any) -> None:
    """Add the work and supervise commands."""
    p = sub.add_parser("work", help="run one job slot in this process until SIGTERM/SIGINT")
    p.add_argument(
        "--app",
        required=True,
        metavar="MODULE:QUEUE",
        help="the brooq.Queue of your app, e.g. myapp.jobs:queue",
    )
    p.add_argument("--max-jobs", type=int, default=0, help="exit after this many attempts")
    p.add_argument(
        "--exit-when-idle", action="store_true", help="exit when no job is ready (scripts, tests)"
    )
    add_setting_flags(p, WORK)
    p.set_defaults(func=cmd_work, needs_schema=False)  # preflight: the app's DSN
    p = sub.add_parser("supervise", help="fork N worker processes and supervise them")
    p.add_argument(
        "--app",
        required=True,
        metavar="MODULE:QUEUE",
        help="the brooq.Queue of your app, e.g. myapp.jobs:queue",
    )
    add_setting_flags(p, SUPERVISE)
    p.set_defaults(func=cmd_supervise, needs_schema=False)  # preflight, too


def app_dsn(settings: Settings, queue: Any) -> str:
    """DATABASE_URL, else the DSN the app's Queue was built with."""
    if settings.database_url:
        return settings.database_url
    dsn = queue.dsn()
    if not dsn:
        raise UsageError("DATABASE_URL is not set and the app's Queue was not built from a DSN")
    return str(dsn)


def served(settings: Settings, registered: Sequence[str]) -> list[str]:
    """The topics to serve: QUEUE_TOPICS / --topics, checked against the app's."""
    if not settings.topics:
        return list(registered)
    unknown = [t for t in settings.topics if t not in registered]
    if unknown:
        raise UsageError(
            f"--topics names topics the app does not handle: {', '.join(unknown)}; "
            f"it handles: {', '.join(registered)}"
        )
    return list(settings.topics)


def cmd_work(args: argparse.Namespace, settings: Settings) -> int:
    """Run one slot in the foreground until SIGTERM/SIGINT."""
    from brooq.app import load_app
    from brooq.inprocess import InProcessSlot, RunOptions

    queue = load_app(args.app)
    queue.configure(settings.kind_options())
    options = RunOptions(
        topics=served(settings, queue.registry.topics()),
        max_jobs=args.max_jobs,
        exit_when_idle=args.exit_when_idle,
    )
    dsn = app_dsn(settings, queue)
    preflight(dsn, workers=0)
    return InProcessSlot(queue, settings, dsn, options).run()


def preflight(dsn: str, workers: int, own: int = SUPERVISOR_CONNECTIONS) -> None:
    """Refuse to start on a database whose migrations are not this brooq's, as a role that
    may not write brooq's tables, or with more workers than the database can connect; warn
    (JitOn) when its statements would be JIT-compiled (through PgBouncer).

    A database that does not answer yet is no reason to refuse: the workers
    wait for it. Each worker opens a connection only for jobs with effects,
    but all of them may, so ``workers`` + the supervisor's ``own`` must fit.
    """
    from brooq.postgres.preflight import (
        check_privileges,
        check_schema,
        connection_room,
        jit_left_on,
    )

    try:
        check_schema(dsn)
        check_privileges(dsn)
        room = connection_room(dsn) if workers else None
        if jit_left_on(dsn):
            _say_jit_on()
    except StoreUnavailable:
        return
    if room is not None and workers + own > room.free:
        raise UsageError(
            f"--workers {workers} may need {workers + own} connections "
            f"({workers} workers + {own} of the supervisor), but the database "
            f"accepts {room.free} more (max_connections {room.max_connections}, "
            f"{room.reserved} reserved, {room.in_use} in use): lower --workers to at most "
            f"{max(0, room.free - own)} or raise max_connections"
        )


def _say_jit_on() -> None:
    """Say once, at start, that brooq's statements will be JIT-compiled, and what to do."""
    from brooq.logs import event

    event(
        logging.getLogger("brooq.supervisor"),
        "JitOn",
        logging.WARNING,
        note="JIT is on for this database role, through PgBouncer (it refuses the startup "
        "option that turns it off): on a large job table PostgreSQL then compiles claims "
        "and settles at each run (~100 ms each); run ALTER ROLE <role> SET jit = off",
    )


def cmd_supervise(args: argparse.Namespace, settings: Settings) -> int:
    """Fork the worker processes and supervise them until SIGTERM/SIGINT/SIGQUIT."""
    from brooq import metrics
    from brooq.supervisor.apploader import AppLoader

    directory = metrics.create_directory()  # before the app can create any metric
    try:
        loader = AppLoader(args.app)
        return supervise(args, settings, loader.load(), loader)
    finally:
        metrics.remove_directory(directory)


def prepare(queue: Any, settings: Settings) -> list[list[str]]:
    """Configure ``queue`` with ``settings``; the topics of each worker slot."""
    from brooq.supervisor.slots import parse_slots

    queue.configure(settings.kind_options())
    topics = served(settings, queue.registry.topics())
    return parse_slots(settings.workers, topics, queue.registry.topics())


def supervise(args: argparse.Namespace, settings: Settings, queue: Any, loader: Any = None) -> int:
    """Assemble the supervisor of ``queue`` and run it (``loader``: SIGHUP loads new code)."""
    from brooq.cli.common import settings_from
    from brooq.metrics import Metrics
    from brooq.supervisor.arbiter import Supervisor
    from brooq.supervisor.reload import Reloader

    slots = prepare(queue, settings)
    dsn = app_dsn(settings, queue)
    own = SUPERVISOR_CONNECTIONS + (SURFACE_CONNECTIONS if settings.http_addr else 0)
    preflight(dsn, workers=len(slots), own=own)
    reloader = (
        None if loader is None else Reloader(loader, lambda: settings_from(args), prepare, slots)
    )
    return Supervisor(
        queue, settings, slots, dsn, name=args.app, metrics=Metrics(), reloader=reloader
    ).run()
