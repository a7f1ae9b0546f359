"""``brooq status``: depth and lag per topic, rate limits, running jobs, recent deaths, the job
table's partitions, schedules.

Once, or redrawn every ``--watch`` seconds; as text or as JSON.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from brooq.cli.common import print_json, require_dsn
from brooq.cli.schedules import HasSchedules, render_schedules, schedules_table
from brooq.cli.text import cut, safe
from brooq.cli.workers import (
    render_versions,
    skipped_json,
    skipped_lines,
    supervisor_json,
    version_rows,
)
from brooq.config import Settings
from brooq.engine.inspection import Inspection, SkippedRow, SupervisorRow
from brooq.vocabulary import BrooqError, SchemaMissing, format_duration

STATES = ("waiting", "pending", "failed", "processing", "done", "dead", "canceled")
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen
DEAD_LISTED = 20


def register(sub: Any) -> None:
    """Add the status command."""
    p = sub.add_parser("status", help="depth, oldest ready age, running and dead jobs")
    p.add_argument("--json", action="store_true", help="one JSON object (a line per refresh)")
    p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=watch_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )
    p.add_argument(
        "--app",
        metavar="MODULE:QUEUE",
        help="also list the app's periodic schedules and their next run",
    )
    p.set_defaults(func=cmd_status)


def watch_seconds(text: str) -> float:
    """``--watch SECONDS``: a positive number of seconds (a bare number here, like watch(1))."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.1 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in [0.1, 86400]")
    return seconds


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    """Depth, lag, running jobs and recent deaths; once, or redrawn every ``--watch`` s."""
    from brooq.postgres.inspection import PostgresInspection

    queue = None
    if args.app:
        from brooq.app import load_app

        queue = load_app(args.app)
    inspection = PostgresInspection(require_dsn(settings))
    try:
        if args.watch is None:
            show(snapshot(inspection, queue), args.json)
            return 0
        return watch(inspection, args.watch, args.json, queue)
    finally:
        inspection.close()


def snapshot(inspection: Inspection, queue: HasSchedules | None = None) -> dict[str, Any]:
    """Every section of ``brooq status`` as JSON-friendly values."""
    dead = inspection.recent_dead(timedelta(hours=1), DEAD_LISTED)
    ready = inspection.oldest_ready()
    snap: dict[str, Any] = {
        "taken_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "depth": [asdict(row) for row in inspection.depth()],
        "oldest_ready_s": ready,
        "rate_limits": [asdict(row) for row in inspection.rate_limits()],
        "paused": [
            {**asdict(p), "paused_at": p.paused_at.astimezone(UTC).isoformat()}
            for p in inspection.pauses()
        ],
        "running": [asdict(row) for row in inspection.running()],
        "dead_last_hour": [
            {**asdict(row), "updated_at": row.updated_at.isoformat()} for row in dead
        ],
        "dead_last_hour_total": inspection.count_dead(timedelta(hours=1)),
        **live_workers(inspection, ready),
        "waiting_by_version": version_rows(inspection),
        "partitions": [
            {
                **asdict(p),
                "starts": p.starts.isoformat() if p.starts else None,
                "ends": p.ends.isoformat() if p.ends else None,
            }
            for p in inspection.partitions()
        ],
    }
    if queue is not None:
        snap["schedules"] = schedules_table(queue)
    return snap


def live_workers(inspection: Inspection, ready: dict[str, float]) -> dict[str, Any]:
    """Live supervisors, their workers, and topics with ready jobs that no one serves.

    None for both when the database lacks the supervisors' table (an older schema).
    """
    try:
        found = inspection.supervisor_rows()
    except SchemaMissing:
        return {"supervisors": None, "unserved_topics": None, "skipped_supervisors": []}
    rows = [r for r in found.rows if r.alive]
    served = {t for r in rows for t in r.topics}
    now = datetime.now(UTC)
    return {
        "supervisors": [supervisor_json(r, now) for r in rows],
        "unserved_topics": sorted(t for t in ready if t not in served),
        "skipped_supervisors": [skipped_json(s) for s in found.skipped],
    }


def show(snap: dict[str, Any], as_json: bool) -> None:
    """Print one snapshot."""
    if as_json:
        print_json(snap)
    else:
        print(render(snap))


def watch(
    inspection: Inspection, interval: float, as_json: bool, queue: HasSchedules | None = None
) -> int:
    """Redraw until SIGINT (exit 0); a database outage is shown, not fatal."""
    import sys

    try:
        while True:
            try:
                snap: dict[str, Any] | None = snapshot(inspection, queue)
                error = None
            except BrooqError as exc:
                snap, error = None, str(exc)
            if as_json:
                print_json(snap if snap is not None else {"error": error})
            else:
                body = render(snap) if snap is not None else f"brooq: error: {error}"
                sys.stdout.write(f"{CLEAR}{body}\n\n(every {interval:g}s; Ctrl-C to quit)\n")
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        if not as_json:
            print()
        return 0


def render(snap: dict[str, Any]) -> str:
    """The text form: one block per section."""
    blocks = [
        f"brooq status at {snap['taken_at']}",
        render_depth(snap["depth"], snap["oldest_ready_s"]),
        *([render_rates(snap["rate_limits"])] if snap.get("rate_limits") else []),
        *([render_paused(snap["paused"])] if snap.get("paused") else []),
        render_running(snap["running"]),
        render_dead(snap["dead_last_hour"], snap["dead_last_hour_total"]),
        render_workers(
            snap["supervisors"], snap["unserved_topics"], snap.get("skipped_supervisors", [])
        ),
        render_partitions(snap["partitions"]),
    ]
    versions = snap.get("waiting_by_version") or []
    if any(v["app_version"] is not None for v in versions):
        live = [_version_holder(r) for r in snap["supervisors"] or []]
        blocks.insert(-1, render_versions(versions, live))
    if "schedules" in snap:
        blocks.append(render_schedules(snap["schedules"]))
    return "\n\n".join(blocks)


def age(seconds: float | None) -> str:
    """A short duration: ``1m30s``, ``250ms``."""
    if not seconds:
        return "0s"
    return format_duration(
        timedelta(seconds=round(seconds))
        if seconds >= 1
        else timedelta(milliseconds=round(seconds * 1000))
    )


def render_depth(rows: list[dict[str, Any]], oldest: dict[str, float]) -> str:
    """Rows per topic and state, with the age of the oldest ready job ("—": none ready)."""
    if not rows:
        return "no jobs"
    by_topic: dict[str, dict[str, int]] = {}
    for row in rows:
        by_topic.setdefault(row["topic"], {})[row["state"]] = row["jobs"]
    width = max(len("topic"), *(len(safe(t)) for t in by_topic))
    head = f"{'topic':<{width}} " + " ".join(f"{s:>10}" for s in STATES) + "  oldest ready"
    lines = [head]
    for topic, counts in sorted(by_topic.items()):
        cells = " ".join(f"{counts.get(s, 0):>10}" for s in STATES)
        ready = age(oldest[topic]) if topic in oldest else "—"
        lines.append(f"{safe(topic):<{width}} {cells}  {ready:>12}")
    return "\n".join(lines)


def render_rates(rows: list[dict[str, Any]]) -> str:
    """Each rate-limited topic: its limit and burst, the tokens its own bucket holds now, its
    keys' buckets in use and those with no token left."""
    width = max(len("topic"), *(len(safe(r["topic"])) for r in rows))
    lines = [
        "rate limits:",
        f"  {'topic':<{width}} {'limit':>9} {'burst':>7} {'tokens':>9} {'keys':>6} {'waiting':>7}",
    ]
    for r in rows:
        lines.append(
            f"  {safe(r['topic']):<{width}} {safe(r['limit']):>9} {r['burst']:>7} "
            f"{r['tokens']:>9.1f} {r['keys']:>6} {r['keys_waiting']:>7}"
        )
    return "\n".join(lines)


def render_paused(rows: list[dict[str, Any]]) -> str:
    """Each paused topic: since when, by whom, why (no supervisor starts its jobs)."""
    lines = ["paused topics (no new job starts; `brooq topics resume TOPIC`):"]
    for r in rows:
        why = f": {safe(r['reason'])}" if r["reason"] else ""
        lines.append(
            f"  {safe(r['topic'])} since {r['paused_at'][:19].replace('T', ' ')} UTC "
            f"by {safe(r['paused_by'])}{why}"
        )
    return "\n".join(lines)


def render_running(rows: list[dict[str, Any]]) -> str:
    """Jobs in flight: id, topic, attempt, lease left, holder."""
    if not rows:
        return "running: none"
    lines = [
        f"running: {len(rows)}",
        f"  {'job':<36}  {'topic':<20} {'attempt':>7}  {'lease left':>10}  holder",
    ]
    for row in rows:
        left = row["lease_left_s"]
        shown = "expired" if left is not None and left < 0 else age(left)
        lines.append(
            f"  {safe(row['id']):<36}  {safe(row['topic']):<20} {row['attempts']:>7}  "
            f"{shown:>10}  {safe(row['locked_by'] or '-')}"
        )
    return "\n".join(lines)


def render_dead(rows: list[dict[str, Any]], total: int) -> str:
    """Jobs that went dead in the last hour: the total, and the newest (capped) with errors."""
    if not total:
        return "dead in the last hour: none"
    more = f" (newest {len(rows)} shown)" if total > len(rows) else ""
    lines = [
        f"dead in the last hour: {total}{more}",
        f"  {'job':<36}  {'topic':<20} {'attempts':>8}  {'at (UTC)':<19}  last error",
    ]
    for row in rows:
        at = datetime.fromisoformat(row["updated_at"]).astimezone(UTC)
        error = cut(safe(row["last_error"] or ""), 60)
        lines.append(
            f"  {safe(row['id']):<36}  {safe(row['topic']):<20} {row['attempts']:>8}  "
            f"{at:%Y-%m-%d %H:%M:%S}  {error}"
        )
    return "\n".join(lines)


def render_workers(
    rows: list[dict[str, Any]] | None,
    unserved: list[str] | None,
    skipped: list[dict[str, str]] | None = None,
) -> str:
    """Live supervisors and workers; topics with ready jobs and no live worker, loudly; the
    rows of brooq_supervisor that could not be read, named."""
    if rows is None:
        return "workers: unknown (the brooq_supervisor table is missing: run `brooq migrate up`)"
    busy = sum(1 for r in rows for w in r["workers"] if w["job_id"])
    total = sum(len(r["workers"]) for r in rows)
    lines = [f"workers: {total} in {len(rows)} supervisor{'s' * (len(rows) != 1)}, {busy} busy"]
    for r in rows:
        lines.append(
            f"  {safe(r['holder'])}  {len(r['workers'])} workers  "
            f"topics {safe(','.join(r['topics']))}"
        )
        for w in r["workers"]:
            if w["job_id"]:
                elapsed = w["elapsed_s"]
                lines.append(
                    f"    worker {w['slot']} pid {w['pid']}: job {safe(w['job_id'])} "
                    f"({safe(w['topic'] or '')})"
                    + (f" for {elapsed:.0f}s" if elapsed is not None else "")
                )
    if unserved:
        lines.append(
            "NO LIVE WORKER serves these topics with ready jobs: "
            + ", ".join(safe(t) for t in unserved)
        )
    lines += skipped_lines([SkippedRow(s["holder"], s["problem"]) for s in skipped or []])
    return "\n".join(lines)


def render_partitions(rows: list[dict[str, Any]]) -> str:
    """job's partitions: range (UTC), rows (the statistics' estimate) and size on disk."""

    def at(text: str | None) -> str:
        return (
            datetime.fromisoformat(text).astimezone(UTC).strftime("%Y-%m-%d %H:%M") if text else ""
        )

    width = max([len("partition"), *(len(r["name"]) for r in rows)])
    lines = [
        f"partitions: {len(rows)} (rows are estimates)",
        f"  {'partition':<{width}}  {'from (UTC)':<16}  {'to (UTC)':<16}"
        f"  {'rows':>10}  {'size':>9}",
    ]
    for r in rows:
        if r["default"]:
            span = f"{'ids outside every range':<34}"
        else:
            span = f"{at(r['starts']) or 'the first':<16}  {at(r['ends']):<16}"
        lines.append(
            f"  {safe(r['name']):<{width}}  {span}  {r['rows']:>10}  {size(r['bytes']):>9}"
        )
    return "\n".join(lines)


def size(n: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1: ``8.0 KiB``."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


def _version_holder(row: dict[str, Any]) -> SupervisorRow:
    """Enough of a live supervisor's JSON for :func:`render_versions`: its version."""
    return SupervisorRow(
        holder=row["holder"],
        host=row["host"],
        pid=row["pid"],
        app=row["app"],
        topics=tuple(row["topics"]),
        started_at=datetime.fromisoformat(row["started_at"]),
        seen_at=datetime.fromisoformat(row["seen_at"]),
        workers=(),
        alive=True,
        app_version=row.get("app_version"),
    )
