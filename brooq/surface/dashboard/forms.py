"""What a dashboard request carries and where its answer leads: filters from query strings
and forms, the confirmation flag, and redirects that never leave the dashboard."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode, urlsplit

from brooq.engine.filters import JobFilter, filter_of
from brooq.surface.wire import Request, Response
from brooq.vocabulary import InvalidInput, State

HTML = "text/html; charset=utf-8"
FILTER_FIELDS = ("topic", "state", "since", "until", "workflow")
_SAFE_PATH = re.compile(r"/ui(/[A-Za-z0-9/_-]*)?(\?[^\r\n]*)?")


def query_filter(
    query: dict[str, list[str]], states: tuple[State, ...] = tuple(State)
) -> JobFilter:
    """The JobFilter of a query string or form; InvalidInput for any bad value."""

    def one(name: str) -> str | None:
        value = (query.get(name) or [""])[0].strip()
        return value or None

    limit = one("limit")
    if limit is not None and not limit.isdigit():
        raise InvalidInput(f"limit {limit!r}: give a positive number")
    return filter_of(
        topics=[t for v in query.get("topic", []) for t in v.split(",")],
        state=one("state"),
        since=one("since"),
        until=one("until"),
        limit=int(limit) if limit else None,
        after=one("after"),
        workflow=one("workflow"),
        states=states,
        default_limit=50,
        flag="",
    )


def filter_pairs(query: dict[str, list[str]]) -> list[tuple[str, str]]:
    """The filter fields of ``query`` (and its limit) as pairs, to link the next page."""
    return [(k, v) for k in (*FILTER_FIELDS, "limit") for v in query.get(k, []) if v.strip()]


def form_values(query: dict[str, list[str]]) -> dict[str, Any]:
    """What the filter form shows again: the topics picked, the other fields as typed."""
    return {
        "topics": [t for v in query.get("topic", []) for t in v.split(",") if t],
        **{k: (query.get(k) or [""])[0] for k in ("state", "since", "until", "workflow", "limit")},
    }


def first(query: dict[str, list[str]], name: str) -> str | None:
    """The first value of ``name`` (at most 300 characters), or None."""
    values = query.get(name)
    return values[0][:300] if values else None


def back(request: Request) -> str:
    """Where "go back" leads: the referring page when it is one of the dashboard's, else /ui."""
    parts = urlsplit(request.header("referer") or "")
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return target if _SAFE_PATH.fullmatch(target) else "/ui"


def confirmed(form: dict[str, list[str]]) -> bool:
    """True when the form was posted from a confirmation page (``confirm=yes``)."""
    return (form.get("confirm") or [""])[0] == "yes"


def redirect(location: str, notice: str | None = None) -> Response:
    """303 See Other to a path of the dashboard (never elsewhere), with a notice to show."""
    if not _SAFE_PATH.fullmatch(location):
        location = "/ui"
    if notice:
        location += ("&" if "?" in location else "?") + urlencode({"notice": notice})
    return Response(303, b"", [("Location", location)], HTML)
