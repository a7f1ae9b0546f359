"""The periodic schedules of ``brooq status --app``: they live in code, not in the database,
so listing them needs the app."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from brooq.cli.text import safe
from brooq.engine.periodic import next_run
from brooq.vocabulary import Schedule


class HasSchedules(Protocol):
    """Anything with ``schedules`` (a brooq.Queue)."""

    schedules: list[Schedule]


def schedules_table(queue: HasSchedules, now: datetime | None = None) -> list[dict[str, Any]]:
    """One JSON-friendly row per schedule, in registration order.

    Keys: name, cron, tz, topic, missed, priority, next_run (ISO 8601, UTC)
    and next_run_local (ISO 8601 in the schedule's time zone). Schedules live
    in code, not in the database: listing them needs the app.
    """
    now = now or datetime.now(UTC)
    rows = []
    for schedule in queue.schedules:
        upcoming = next_run(schedule, now)
        rows.append(
            {
                "name": schedule.name,
                "cron": schedule.cron,
                "tz": schedule.tz,
                "topic": schedule.topic,
                "missed": schedule.missed,
                "priority": schedule.priority,
                "next_run": upcoming.isoformat(),
                "next_run_local": upcoming.astimezone(ZoneInfo(schedule.tz)).isoformat(),
            }
        )
    return rows


def render_schedules(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of :func:`schedules_table` rows ("schedules: none" when empty)."""
    if not rows:
        return "schedules: none"
    columns = ["name", "cron", "tz", "topic", "missed", "next_run"]
    cells = [[safe(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["schedules:"]
    for values in [columns, *cells]:
        lines.append(
            "  " + "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()
        )
    return "\n".join(lines)
