"""``brooq enqueue``, ``brooq job`` and ``brooq cancel``: one job at a time."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from brooq.cli.common import print_json, require_dsn
from brooq.cli.errors import UsageError
from brooq.cli.text import safe
from brooq.config import Settings
from brooq.engine.inspection import Family, Relative
from brooq.postgres.inspection import PostgresInspection
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import JOB_OVERRIDES, Job, JobRecord, parse_duration, parse_job_id


def register(sub: Any) -> None:
    """Add the enqueue, job and cancel commands."""
    p = sub.add_parser("enqueue", help="enqueue one job and print its id")
    p.add_argument("--topic", required=True, help="the job's topic, e.g. email.send")
    p.add_argument(
        "--payload",
        required=True,
        metavar="JSON|@FILE|-",
        help="the payload: JSON text, @path to read it from a file, - for stdin",
    )
    p.add_argument("--key", help="idempotency key (per topic)")
    p.add_argument("--at", help="ISO 8601 time with zone, or a delay like 30s")
    p.add_argument(
        "--priority",
        type=int,
        default=0,
        help="higher runs first among ready jobs of a topic (-32768..32767)",
    )
    p.add_argument(
        "--after",
        action="append",
        default=[],
        metavar="ID",
        help="wait (state waiting) until this job has ended (repeat for several parents)",
    )
    p.add_argument(
        "--if-parent-fails",
        choices=("cancel", "run"),
        default="cancel",
        help="when a parent ends dead or canceled, or does not exist: cancel this job "
        "(default) or run it anyway",
    )
    overrides = p.add_argument_group(
        "this job's own options", "override the kind's options for this job only"
    )
    # dest job_…: the settings (QUEUE_MAX_ATTEMPTS, …) read every flag named like themselves
    overrides.add_argument(
        "--max-attempts", dest="job_max_attempts", metavar="N", help="attempts before it is dead"
    )
    for flag, what in (
        ("--attempt-timeout", "soft limit of one attempt (AttemptTimedOut in the handler)"),
        ("--max-execution-timeout", "hard limit of one attempt (the supervisor kills it)"),
        ("--backoff-base", "first retry delay"),
        ("--backoff-max", "longest retry delay"),
    ):
        overrides.add_argument(
            flag,
            dest="job_" + flag[2:].replace("-", "_"),
            metavar="DURATION",
            help=f"{what}, with units (30s, 2m)",
        )
    p.set_defaults(func=cmd_enqueue)
    p = sub.add_parser("job", help="show a job's row (its whole fate), its parents and children")
    p.add_argument("id", help="the job's id (a UUID)")
    p.add_argument("--json", action="store_true", help="the row as one JSON object")
    p.set_defaults(func=cmd_job)
    p = sub.add_parser("cancel", help="cancel a waiting, pending, failed or running job")
    p.add_argument("id", help="the job's id (a UUID)")
    p.add_argument("--reason", help="kept in last_error as 'canceled: REASON'")
    p.set_defaults(func=cmd_cancel)


def store_for(settings: Settings) -> PostgresStore:
    """A store on DATABASE_URL for one command."""
    return PostgresStore(
        require_dsn(settings), notify=settings.notify, max_payload_bytes=settings.max_payload_bytes
    )


def parse_at(text: str, now: datetime | None = None) -> datetime:
    """``--at``: an ISO 8601 time with a zone, or a duration with units meaning "from now"."""
    now = now or datetime.now(UTC)
    try:
        return now + parse_duration(text)
    except (ValueError, OverflowError):
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


def read_payload(given: str) -> Any:
    """The payload of ``--payload``: JSON text, ``@file`` or ``-`` (standard input)."""
    where = "--payload"
    if given == "-":
        text, where = sys.stdin.read(), "the payload on standard input"
    elif given.startswith("@"):
        path = Path(given[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"--payload {given}: cannot read {path} ({type(exc).__name__})"
            ) from None
        where = f"the payload in {path}"
    else:
        text = given
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError(f"{where} is nested too deeply; flatten it") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise UsageError(f"{where} cannot be read: {exc}") from None


def max_attempts_of(text: str | None) -> int | None:
    """``--max-attempts``: a whole number (checked further as a kind's max_attempts is)."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--max-attempts must be a whole number, got {safe(text)!r}") from None


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    """Enqueue one job; print ``{"id": …, "created": …, "state": …}``."""
    payload = read_payload(args.payload)
    at = parse_at(args.at) if args.at else None
    job = Job(
        topic=args.topic,
        payload=payload,
        idempotency_key=args.key,
        available_at=at,
        priority=args.priority,
        after=[job_id_of(i) for i in args.after],
        if_parent_fails=args.if_parent_fails,
        max_attempts=max_attempts_of(args.job_max_attempts),
        attempt_timeout=args.job_attempt_timeout,
        max_execution_timeout=args.job_max_execution_timeout,
        backoff_base=args.job_backoff_base,
        backoff_max=args.job_backoff_max,
    )
    store = store_for(settings)
    try:
        (result,) = store.enqueue_many([job])
    finally:
        store.close()
    print_json({"id": result.id, "created": result.created, "state": str(result.state)})
    if not result.created:
        print(
            f"brooq: a job with this key already exists ({result.state}); nothing enqueued"
            + (
                "; to run it again, enqueue without --key, or delete that row first"
                if str(result.state) in ("dead", "canceled")
                else ""
            ),
            file=sys.stderr,
        )
    return 0


def presented(record: JobRecord) -> dict[str, Any]:
    """A row as `brooq job` shows it: only a processing row is locked.

    Elsewhere ``locked_by`` and ``locked_until`` are empty and ``last_holder``
    names who ran the last attempt (the column keeps it for the record).
    """
    row = record.as_dict()
    row["last_holder"] = row["locked_by"]
    if row["state"] != "processing":
        row["locked_by"] = row["locked_until"] = None
    return row


def job_lines(record: JobRecord) -> list[str]:
    """The text form of a row: one ``key  value`` line each, data escaped."""
    row = presented(record)
    if row["state"] != "processing":
        row.pop("locked_by")
    else:
        row.pop("last_holder")
    if row["workflow_id"] is None:
        row.pop("workflow_id")
    if row["if_parent_fails"] is None:  # a job without parents
        row.pop("if_parent_fails")
        row.pop("parents_left")
    for name in (*JOB_OVERRIDES, "trace_context"):
        if row[name] is None:  # the kind's option holds: nothing of the job's own to show
            row.pop(name)
    trace = row.pop("last_traceback", None)
    if row.get("payload_error") is None:
        row.pop("payload_error", None)  # only a payload Python cannot decode has one
    width = max(len(k) for k in row)
    lines = []
    for key, value in row.items():
        shown = (
            json.dumps(value, ensure_ascii=False)
            if key in ("payload", "trace_context") or (key == "result" and value is not None)
            else value
        )
        lines.append(f"{key:<{width}}  {'' if shown is None else safe(shown)}")
    if trace:
        lines.append("last_traceback:")
        lines += ["  " + safe(line) for line in str(trace).splitlines()]
    return lines


def family_lines(family: Family) -> list[str]:
    """The parents and the children of a job, one ``  id  state`` line each (none: no lines)."""
    lines: list[str] = []
    for title, relatives, total in (
        ("parents", family.parents, family.parents_total),
        ("children", family.children, family.children_total),
    ):
        if not total:
            continue
        lines.append(f"{title} ({total}):")
        lines += [f"  {r.id}  {r.state or 'gone'}" for r in relatives]
        if total > len(relatives):
            lines.append(f"  … and {total - len(relatives)} more")
    return lines


def family_json(family: Family) -> dict[str, Any]:
    """The parents and children of a job as JSON fields (a gone parent's state is null)."""

    def side(relatives: list[Relative]) -> list[dict[str, Any]]:
        return [{"id": r.id, "state": None if r.state is None else str(r.state)} for r in relatives]

    return {
        "parents": side(family.parents),
        "parents_total": family.parents_total,
        "children": side(family.children),
        "children_total": family.children_total,
    }


def job_id_of(text: str) -> str:
    """A job id given on the command line; UsageError (exit 2) when it is not a UUID."""
    try:
        return parse_job_id(text)
    except ValueError as exc:
        raise UsageError(safe(str(exc))) from None


def cmd_job(args: argparse.Namespace, settings: Settings) -> int:
    """Show the whole fate of one job, and the jobs it waits for and that wait for it."""
    args.id = job_id_of(args.id)
    inspection = PostgresInspection(require_dsn(settings))
    try:
        record = inspection.job(args.id)
        family = inspection.family(args.id)
    finally:
        inspection.close()
    if args.json:
        print_json({**presented(record), **family_json(family)})
    else:
        print("\n".join(job_lines(record) + family_lines(family)))
    return 0


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel a job that is not terminal yet."""
    args.id = job_id_of(args.id)
    store = store_for(settings)
    try:
        canceled = store.cancel(args.id, args.reason)
        state = store.get(args.id).state
    finally:
        store.close()
    if canceled:
        print(f"canceled {safe(args.id)}")
        return 0
    print(f"job {safe(args.id)} is already {state}; nothing changed", file=sys.stderr)
    return 1
