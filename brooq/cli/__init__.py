"""The ``brooq`` command: migrate, enqueue, inspect, operate, configure, work, supervise.

One module per command group; the flags of settings come from the settings
table. Before a command that touches the job table runs, the database's
migrations are checked against this brooq's (``needs_schema``, true unless a
command says otherwise). Exit codes are in :class:`brooq.cli.errors.Exit`: 0 success, 1 an
operation failed, 2 bad input or configuration, 70 a bug in brooq.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from collections.abc import Sequence

from brooq import __version__
from brooq.cli import (
    configure,
    dashboard,
    jobgroup,
    jobs,
    migrate,
    run,
    status,
    topics,
    workers,
)
from brooq.cli.common import add_global_flags, require_dsn, settings_from
from brooq.cli.errors import Exit, UsageError
from brooq.cli.parsing import StrictParser
from brooq.config import ConfigError, Settings
from brooq.logs import hide_secrets, setup_logging
from brooq.vocabulary import BrooqError, InvalidInput, SchemaMissing, StoreUnavailable
from brooq.vocabulary.secrets import dsn_passwords

__all__ = ["Exit", "UsageError", "main", "parser"]

COMMAND_GROUPS = (migrate, jobs, jobgroup, status, workers, topics, configure, run, dashboard)


def parser() -> argparse.ArgumentParser:
    """The whole command line."""
    top = StrictParser(
        prog="brooq",
        description="brooq: a PostgreSQL-backed job queue.",
        epilog="Configuration: environment, .env, --config TOML, flags. See `brooq config show`.",
    )
    top.add_argument("--version", action="version", version=f"brooq {__version__}")
    add_global_flags(top)
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(sub)
    _global_flags_after_commands(top)
    return top


def _global_flags_after_commands(parser: argparse.ArgumentParser) -> None:
    """Accept the global flags after every command too (``brooq config show --config x``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in set(action.choices.values()):
                add_global_flags(command, after_command=True)
                _global_flags_after_commands(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``brooq`` command; returns the exit code."""
    top = parser()
    args = top.parse_args(argv)
    if not getattr(args, "func", None):
        top.print_help()
        return Exit.USAGE
    try:
        settings = settings_from(args)
        setup_logging(settings.log_format, settings.log_level)
        hide_secrets(
            [
                *dsn_passwords(settings.database_url),
                *dsn_passwords(settings.listen_url),
                settings.token or "",
            ]
        )
        if settings.pgbouncer:
            from brooq.postgres.connect import use_pgbouncer

            use_pgbouncer()
        if getattr(args, "needs_schema", True):
            _check_schema(settings)
        code: int = args.func(args, settings)
        return code
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"brooq: config: {problem}", file=sys.stderr)
        return Exit.USAGE
    except SchemaMissing as exc:
        print(exc, file=sys.stderr)  # the whole advice, on its own line
        return Exit.USAGE
    except InvalidInput as exc:
        print(f"brooq: error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except BrooqError as exc:
        print(f"brooq: error: {exc}", file=sys.stderr)
        return Exit.FAILED
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except BrokenPipeError:
        return _closed_stdout()
    except Exception:
        traceback.print_exc()
        print(
            "brooq: internal error (a bug in brooq; please report it with the traceback above)",
            file=sys.stderr,
        )
        return Exit.BUG


def _check_schema(settings: Settings) -> None:
    """Refuse a database whose migrations are not this brooq's (exit 2, with what to run).

    A database that does not answer is left to the command, which says so
    in its own way (``status --watch`` keeps redrawing until it answers).
    """
    from brooq.postgres.preflight import check_schema

    with contextlib.suppress(StoreUnavailable):
        check_schema(require_dsn(settings))


def _closed_stdout() -> int:
    """``brooq status | head``: the reader left; exit quietly, as Unix tools do."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return Exit.OK
