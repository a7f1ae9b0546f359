"""HTML of the dashboard: one Jinja2 environment with autoescape on, and the chart's geometry.

Every value a template prints is escaped (payloads, errors and topics are
user data); templates never use ``|safe``. The chart is inline SVG built from
numbers only, so nothing in it needs a script or an asset from elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import jinja2

from brooq.engine.inspection import MinuteCount
from brooq.surface.dashboard.access import Access, Verdict
from brooq.surface.dashboard.forms import HTML, first
from brooq.surface.wire import Request, Response
from brooq.vocabulary import format_duration


@cache
def environment() -> jinja2.Environment:
    """The templates of this package, autoescaped whatever their file name."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("brooq.surface.dashboard", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = when
    env.filters["age"] = age
    env.filters["pretty"] = pretty
    env.filters["shown_result"] = shown_result
    env.filters["ago"] = ago
    env.filters["duration"] = format_duration
    return env


def page(name: str, **context: Any) -> str:
    """Render template ``name`` with ``context``."""
    return environment().get_template(name).render(**context)


def when(value: datetime | None) -> str:
    """A timestamp as ``2026-12-03 07:21:05 UTC`` (empty for none)."""
    return "" if value is None else f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def age(seconds: float | None) -> str:
    """Seconds as ``1m30s`` ("—" for none)."""
    if seconds is None:
        return "—"
    return format_duration(timedelta(seconds=round(max(0.0, seconds)))) if seconds >= 1 else "0s"


def ago(value: datetime | None) -> str:
    """How long ago ``value`` was, as ``1m30s`` ("—" for none)."""
    if value is None:
        return "—"
    return age((datetime.now(UTC) - value).total_seconds())


def pretty(value: Any) -> str:
    """A payload as indented JSON text (escaped by the template like any other text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


RESULT_SHOWN_CHARS = 20_000
"""A result longer than this (as indented JSON) is cut on the job page, its size said."""


def shown_result(value: Any) -> str:
    """A job's result as indented JSON, cut at RESULT_SHOWN_CHARS with its whole size."""
    text = pretty(value)
    if len(text) <= RESULT_SHOWN_CHARS:
        return text
    size = len(json.dumps(value, ensure_ascii=False).encode())
    return f"{text[:RESULT_SHOWN_CHARS]}\n… (cut: the result is {size} bytes of JSON)"


@dataclass(frozen=True)
class Chart:
    """Done and dead per minute as two SVG polylines, with the scale to label them."""

    width: int
    height: int
    done_points: str
    dead_points: str
    done_area: str
    """The done line closed along the x axis: a filled area, so an equal dead line
    drawn over it never hides it."""
    peak: int
    done_total: int
    dead_total: int
    start: datetime | None
    end: datetime | None


def chart(minutes: Sequence[MinuteCount], width: int = 720, height: int = 160) -> Chart:
    """The geometry of the throughput chart (x: minutes, y: jobs per minute)."""
    peak = max([1, *(max(m.done, m.dead) for m in minutes)])
    step = width / max(1, len(minutes) - 1)

    def points(values: list[int]) -> str:
        return " ".join(
            f"{i * step:.1f},{height - v / peak * (height - 8) - 4:.1f}"
            for i, v in enumerate(values)
        )

    done = points([m.done for m in minutes])
    return Chart(
        width,
        height,
        done,
        points([m.dead for m in minutes]),
        f"0,{height} {done} {step * max(0, len(minutes) - 1):.1f},{height}",
        peak,
        sum(m.done for m in minutes),
        sum(m.dead for m in minutes),
        minutes[0].minute if minutes else None,
        minutes[-1].minute if minutes else None,
    )


class Screen:
    """Renders the dashboard's pages for a request: the session's rights, CSRF, the notice."""

    def __init__(self, access: Access, where: str) -> None:
        self.access, self.where = access, where

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        """Template ``template`` as an HTML answer for ``request``."""
        verdict = self.access.verdict(request)
        html = page(
            template,
            verdict=str(verdict),
            can_act=verdict is Verdict.ALLOWED,
            csrf=self.access.csrf_for(request) if verdict is Verdict.ALLOWED else "",
            where=self.where,
            path=request.path,
            notice=first(request.query, "notice"),
            **context,
        )
        return Response(status, html.encode(), [], HTML)

    def message(self, request: Request, status: int, title: str, text: str) -> Response:
        """A page that says ``title`` and ``text``, and nothing else."""
        return self.render(request, "message.html", status, title=title, text=text)
