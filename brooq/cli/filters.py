"""The filter flags of the job commands (``--topic``, ``--state``, ``--since``, ``--until``,
``--workflow``, ``--limit``, ``--after``), made into one :class:`brooq.engine.filters.JobFilter`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from brooq.cli.errors import UsageError
from brooq.engine.filters import JobFilter, filter_of
from brooq.vocabulary import InvalidInput, State


def add_filter_flags(
    parser: argparse.ArgumentParser,
    states: Sequence[State] = tuple(State),
    *,
    state_required: bool = False,
    paging: bool = False,
    limit_help: str = "change at most N jobs (default: every match)",
) -> None:
    """Add the filter flags; ``states`` are the choices of ``--state``."""
    names = "|".join(str(s) for s in states)
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="TOPIC",
        help="only jobs of this topic (repeat for several)",
    )
    parser.add_argument(
        "--state", required=state_required, metavar=names, help=f"only jobs in this state ({names})"
    )
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only jobs updated since: a duration ago (1h, 30m) or an ISO 8601 time with a zone",
    )
    parser.add_argument(
        "--until",
        metavar="WHEN",
        help="only jobs updated before: a duration ago or an ISO 8601 time",
    )
    parser.add_argument(
        "--workflow", metavar="ID", help="only jobs of this workflow (its id: workflow.id)"
    )
    parser.add_argument("--limit", type=int, default=None, metavar="N", help=limit_help)
    if paging:
        parser.add_argument(
            "--after",
            metavar="CURSOR",
            help="the page after this cursor (printed at the end of a page)",
        )
    parser.add_argument("--json", action="store_true", help="JSON output, one document")


def filter_from(
    args: argparse.Namespace,
    states: Sequence[State] = tuple(State),
    ids: Sequence[str] = (),
    default_limit: int = 0,
) -> JobFilter:
    """The JobFilter the flags describe; UsageError (exit 2) for any bad value.

    A value given empty or blank is refused, never read as "no filter": an
    unset shell variable (``--topic "$TOPIC"``) must not widen a bulk action
    to every job.
    """
    refuse_blank(args, ids)
    try:
        return filter_of(
            topics=args.topic,
            state=args.state,
            since=args.since,
            until=args.until,
            limit=args.limit,
            after=getattr(args, "after", None),
            ids=ids,
            workflow=args.workflow,
            states=states,
            default_limit=default_limit,
        )
    except InvalidInput as exc:
        raise UsageError(str(exc)) from None


def refuse_blank(args: argparse.Namespace, ids: Sequence[str] = ()) -> None:
    """UsageError naming every filter flag (or job id) given as an empty or blank value."""
    given = [("--topic", t) for t in args.topic] + [
        (f"--{name}", getattr(args, name, None))
        for name in ("state", "since", "until", "after", "workflow")
    ]
    blank = [flag for flag, value in given if value is not None and not value.strip()]
    blank += ["a job id"] * any(not i.strip() for i in ids)
    if blank:
        raise UsageError(
            f"{', '.join(dict.fromkeys(blank))} given empty: name a value, or leave the flag "
            "out (an unset shell variable?); an empty filter never means every job"
        )
