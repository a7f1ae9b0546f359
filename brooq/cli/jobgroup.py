"""``brooq jobs list|retry|cancel|purge|retarget``: the everyday job commands of an operator.

Every command takes the same filters (brooq.cli.filters), prints a count of
what it changed (``--json``: one document), and exits 2 on bad input. The
state guards live in the SQL (brooq/postgres/queries.sql): retry only moves
``dead`` (or ``canceled``) rows, cancel only ``pending``/``failed`` ones,
purge only deletes terminal rows, retarget only moves the app version of rows not
started yet — whatever filter is given. ``jobs cancel --workflow
ID`` cancels every job of a workflow that has not ended, running ones too, in one
statement.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from datetime import UTC
from typing import TYPE_CHECKING, Any

from brooq.cli.common import print_json, require_dsn
from brooq.cli.errors import Exit, UsageError
from brooq.cli.filters import add_filter_flags, filter_from
from brooq.cli.text import cut, safe
from brooq.config import Settings
from brooq.engine.admin import CANCELABLE, PURGEABLE, RETARGETABLE, RETRYABLE
from brooq.engine.filters import JobFilter
from brooq.engine.inspection import JobPage, JobRow
from brooq.vocabulary import InvalidInput, State, app_version

if TYPE_CHECKING:  # the driver is loaded only when a command needs the database
    from brooq.postgres.admin import PostgresAdmin
    from brooq.postgres.inspection import PostgresInspection


def register(sub: Any) -> None:
    """Add ``brooq jobs`` and its subcommands."""
    group = sub.add_parser("jobs", help="list, retry, cancel and purge jobs in bulk")
    group.set_defaults(func=lambda args, settings: _help(group), needs_schema=False)
    cmds = group.add_subparsers(dest="jobs_command", metavar="ACTION")
    p = cmds.add_parser("list", help="a table of jobs, newest first, one page at a time")
    add_filter_flags(p, paging=True, limit_help="jobs per page (default 50, at most 1000)")
    p.set_defaults(func=cmd_list, needs_schema=True)
    p = cmds.add_parser("retry", help="dead (or canceled) jobs back to pending now")
    p.add_argument("ids", nargs="*", metavar="ID", help="jobs to retry (else: the filters)")
    add_filter_flags(p, RETRYABLE)
    _bulk_flags(p)
    p.set_defaults(func=cmd_retry, needs_schema=True)
    p = cmds.add_parser(
        "cancel",
        help="cancel waiting, pending or failed jobs in bulk (--workflow ID: all of a workflow)",
    )
    p.add_argument("ids", nargs="*", metavar="ID", help="jobs to cancel (else: the filters)")
    add_filter_flags(p, CANCELABLE)
    p.add_argument("--reason", help="kept in last_error as 'canceled: REASON'")
    _bulk_flags(p)
    p.set_defaults(func=cmd_cancel, needs_schema=True)
    p = cmds.add_parser("purge", help="delete done, dead or canceled jobs, in batches")
    add_filter_flags(p, PURGEABLE, state_required=True)
    _bulk_flags(p)
    p.set_defaults(func=cmd_purge, needs_schema=True)
    p = cmds.add_parser(
        "retarget",
        help="move jobs not started yet from one app version to another (rolling deploys)",
    )
    p.add_argument("ids", nargs="*", metavar="ID", help="jobs to move (else: the filters)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-version", metavar="VERSION", help="jobs of this app version")
    source.add_argument(
        "--from-unversioned", action="store_true", help="jobs without an app version"
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-version", metavar="VERSION", help="the app version they get")
    target.add_argument(
        "--to-unversioned",
        action="store_true",
        help="take their version away (every supervisor of any version claims them)",
    )
    add_filter_flags(p, RETARGETABLE)
    _bulk_flags(p)
    p.set_defaults(func=cmd_retarget, needs_schema=True)


def _bulk_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run", action="store_true", help="print how many jobs would change, change nothing"
    )


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return Exit.USAGE


def _inspection(settings: Settings) -> PostgresInspection:
    from brooq.postgres.inspection import PostgresInspection

    return PostgresInspection(require_dsn(settings))


def _admin(settings: Settings) -> PostgresAdmin:
    from brooq.postgres.admin import PostgresAdmin

    return PostgresAdmin(require_dsn(settings))


# --- list ------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    """Print one page of jobs, newest first, and how to get the next."""
    where = filter_from(args)
    inspection = _inspection(settings)
    try:
        page: JobPage = inspection.list_jobs(where)
    finally:
        inspection.close()
    cursor = page.next.encode() if page.next else None
    if args.json:
        print_json(
            {"jobs": [_job_json(r) for r in page.rows], "count": len(page.rows), "next": cursor}
        )
        return 0
    print(render_page(page))
    if cursor:
        print(f"next page: --after {cursor}", file=sys.stderr)
    return 0


def _job_json(row: JobRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "topic": row.topic,
        "state": row.state,
        "attempts": row.attempts,
        "expirations": row.expirations,
        "priority": row.priority,
        "available_at": row.available_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
        "last_error": row.last_error,
    }


def render_page(page: JobPage) -> str:
    """The text table of a page: id, topic, state, attempts, times, last_error cut short."""
    if not page.rows:
        return "no jobs match"
    width = max(len("topic"), *(len(safe(r.topic)) for r in page.rows))
    lines = [
        f"{'id':<36}  {'topic':<{width}}  {'state':<10} {'attempts':>8}  "
        f"{'available_at (UTC)':<19}  {'updated_at (UTC)':<19}  last_error"
    ]
    for r in page.rows:
        lines.append(
            f"{safe(r.id):<36}  {safe(r.topic):<{width}}  {safe(r.state):<10} {r.attempts:>8}  "
            f"{r.available_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}  "
            f"{r.updated_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}  "
            f"{cut(safe(r.last_error or ''), 60)}"
        )
    return "\n".join(lines)


# --- retry, cancel, purge --------------------------------------------------------------------


def _count(settings: Settings, where: JobFilter, states: tuple[State, ...]) -> int:
    inspection = _inspection(settings)
    try:
        if where.state is not None:
            return int(inspection.count_jobs(where))
        return sum(int(inspection.count_jobs(replace(where, state=s))) for s in states)
    finally:
        inspection.close()


def _report(args: argparse.Namespace, verb: str, count: int, **extra: Any) -> None:
    if args.json:
        print_json({verb: count, "dry_run": bool(args.dry_run), **extra})
    elif args.dry_run:
        print(f"would have {verb} {count} job{'s' * (count != 1)} (dry run: nothing changed)")
    else:
        print(f"{verb} {count} job{'s' * (count != 1)}")


def cmd_retry(args: argparse.Namespace, settings: Settings) -> int:
    """Retry the given dead jobs, or every dead (or canceled) job the filters match."""
    where = filter_from(args, RETRYABLE, args.ids)
    if not args.ids and not args.state:
        raise UsageError("retry needs job ids or --state dead|canceled (with filters)")
    where = replace(where, state=where.state or State.DEAD)
    if args.dry_run:
        _report(args, "retried", _count(settings, where, RETRYABLE))
        return 0
    admin = _admin(settings)
    try:
        retried = admin.retry(where)
    finally:
        admin.close()
    # The ids only when asked by id: a retry by filter may move millions of rows.
    _report(args, "retried", len(retried), **({"ids": retried} if where.ids else {}))
    missed = [i for i in where.ids if i not in set(retried)]
    if missed and not args.json:
        for job_id in missed:
            print(f"job {safe(job_id)} was not retried: it is not {where.state}", file=sys.stderr)
    return Exit.FAILED if where.ids and not retried else 0


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel every waiting, pending or failed job the ids or filters match, or every job of
    a workflow that has not ended."""
    where = filter_from(args, CANCELABLE, args.ids)
    reason = reason_of(args.reason)
    if where.workflow is not None:
        return _cancel_workflow(args, settings, where, reason)
    if not args.ids and not args.topic:
        raise UsageError("cancel in bulk needs job ids, at least one --topic, or --workflow")
    if args.dry_run:
        _report(args, "canceled", _count(settings, where, CANCELABLE))
        return 0
    admin = _admin(settings)
    try:
        done = admin.cancel_many(where, reason)
    finally:
        admin.close()
    _report(args, "canceled", done.canceled, left=done.left)
    if done.left:
        print(
            f"{done.left} matching job{'s were' if done.left != 1 else ' was'} not canceled: "
            "locked by another transaction through every pass (a worker claiming them, an "
            "open transaction), or enqueued meanwhile; list them with `brooq jobs list` "
            "and run the command again",
            file=sys.stderr,
        )
        return Exit.FAILED
    return Exit.FAILED if where.ids and not done.canceled else 0


def _cancel_workflow(
    args: argparse.Namespace, settings: Settings, where: JobFilter, reason: str | None
) -> int:
    """``jobs cancel --workflow ID``: the whole workflow, in one statement."""
    others = [flag for flag, given in _narrowing(args) if given]
    if others:
        raise UsageError(
            f"--workflow cancels every job of the workflow that has not ended; it takes no "
            f"other filter ({', '.join(others)} given): list them with `brooq jobs list "
            "--workflow ID`"
        )
    assert where.workflow is not None
    if args.dry_run:
        live = tuple(s for s in State if not s.is_terminal)
        _report(args, "canceled", _count(settings, where, live))
        return 0
    admin = _admin(settings)
    try:
        canceled = admin.cancel_workflow(where.workflow, reason)
    finally:
        admin.close()
    _report(args, "canceled", canceled)
    return 0


def _narrowing(args: argparse.Namespace) -> list[tuple[str, bool]]:
    """The filter flags besides --workflow, and whether each was given."""
    return [
        ("job ids", bool(args.ids)),
        ("--topic", bool(args.topic)),
        ("--state", args.state is not None),
        ("--since", args.since is not None),
        ("--until", args.until is not None),
        ("--limit", args.limit is not None),
    ]


def reason_of(given: str | None) -> str | None:
    """``--reason`` checked and bounded as ``brooq cancel`` does (UsageError: exit 2)."""
    from brooq.engine.outcome import clean_reason

    if given is None:
        return None
    try:
        return clean_reason(given)
    except InvalidInput as exc:
        raise UsageError(f"--reason: {exc}") from None


def cmd_purge(args: argparse.Namespace, settings: Settings) -> int:
    """Delete the done, dead or canceled jobs the filters match, in batches."""
    where = filter_from(args, PURGEABLE)
    if args.dry_run:
        _report(args, "purged", _count(settings, where, PURGEABLE))
        return 0
    admin = _admin(settings)
    try:
        purged = admin.purge(where)
    finally:
        admin.close()
    _report(args, "purged", purged)
    return 0


def cmd_retarget(args: argparse.Namespace, settings: Settings) -> int:
    """Move the waiting, pending and failed jobs of one app version (or none) that the ids or
    filters match to another (or none): after a rolling deploy, the jobs the old version
    left for supervisors that are gone."""
    where = filter_from(args, RETARGETABLE, args.ids)
    source = _version_flag("--from-version", args.from_version, args.from_unversioned)
    target = _version_flag("--to-version", args.to_version, args.to_unversioned)
    if source == target:
        raise UsageError(
            f"--from and --to name the same version ({source or 'unversioned'}): nothing to move"
        )
    admin = _admin(settings)
    try:
        if args.dry_run:
            _report(args, "retargeted", admin.count_retargetable(where, source))
            return 0
        moved = admin.retarget(where, source, target)
        left = admin.count_retargetable(where, source) if not where.limit else 0
    finally:
        admin.close()
    _report(args, "retargeted", moved, left=left)
    if left:
        print(
            f"{left} matching job{'s were' if left != 1 else ' was'} not retargeted: locked "
            "by another transaction (a claim in flight), or enqueued meanwhile by the old "
            "version; run the command again once its supervisors and enqueuers have stopped",
            file=sys.stderr,
        )
        return Exit.FAILED
    return 0


def _version_flag(flag: str, given: str | None, unversioned: bool) -> str | None:
    """The version a --from/--to flag names (None: unversioned); UsageError when invalid."""
    if unversioned:
        return None
    if given is None or not given.strip():
        raise UsageError(f"{flag} given empty: name a version, or use the -unversioned flag")
    try:
        return app_version(given)
    except InvalidInput as exc:
        raise UsageError(f"{flag}: {exc}") from None
