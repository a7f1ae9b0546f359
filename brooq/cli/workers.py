"""``brooq workers``: every supervisor and worker alive against this database, across hosts."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from brooq.cli.common import print_json, require_dsn
from brooq.cli.text import safe
from brooq.config import Settings
from brooq.engine.inspection import Inspection, SkippedRow, SupervisorRow
from brooq.vocabulary import SchemaMissing, format_duration


def register(sub: Any) -> None:
    """Add the workers command."""
    p = sub.add_parser("workers", help="supervisors and workers alive against this database")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument(
        "--all",
        action="store_true",
        help="also list supervisors not seen lately (dead, until their row expires)",
    )
    p.set_defaults(func=cmd_workers)


def cmd_workers(args: argparse.Namespace, settings: Settings) -> int:
    """Print the registered supervisors and what each worker runs."""
    from brooq.postgres.inspection import PostgresInspection
    from brooq.postgres.preflight import check_schema

    dsn = require_dsn(settings)
    inspection = PostgresInspection(dsn)
    try:
        found = inspection.supervisor_rows()
        versions = version_rows(inspection)
    except SchemaMissing:
        check_schema(dsn)  # no job table at all: say that, the first thing to fix
        raise
    finally:
        inspection.close()
    rows = [r for r in found.rows if r.alive or args.all]
    now = datetime.now(UTC)
    if args.json:
        print_json(
            {
                "supervisors": [supervisor_json(r, now) for r in rows],
                "skipped": [skipped_json(s) for s in found.skipped],
                "waiting_by_version": versions,
            }
        )
    else:
        print(render(rows, now))
        if any(v["app_version"] is not None for v in versions):
            print()
            print(render_versions(versions, [r for r in rows if r.alive]))
        for line in skipped_lines(found.skipped):
            print(f"brooq: warning: {line}", file=sys.stderr)
    return 0


def skipped_json(row: SkippedRow) -> dict[str, str]:
    """A row of brooq_supervisor no view can read, as JSON."""
    return {"holder": row.holder, "problem": row.problem}


def skipped_lines(rows: list[SkippedRow]) -> list[str]:
    """One line per row of brooq_supervisor that was skipped, naming it and why (escaped)."""
    return [
        f"skipped a row of brooq_supervisor that cannot be read: holder {safe(r.holder)}: "
        f"{safe(r.problem)}"
        for r in rows
    ]


def ago(then: datetime | None, now: datetime) -> str:
    """``3s`` from a past time (``-`` for none)."""
    if then is None:
        return "-"
    seconds = max(0, round((now - then).total_seconds()))
    return format_duration(timedelta(seconds=seconds)) if seconds else "0s"


def supervisor_json(row: SupervisorRow, now: datetime) -> dict[str, Any]:
    """A supervisor and its workers as JSON-friendly values (elapsed in seconds)."""
    return {
        "holder": row.holder,
        "host": row.host,
        "pid": row.pid,
        "app": row.app,
        "topics": list(row.topics),
        "started_at": row.started_at.isoformat(),
        "seen_at": row.seen_at.isoformat(),
        "alive": row.alive,
        "app_version": row.app_version,
        "workers": [
            {
                "pid": w.pid,
                "slot": w.slot,
                "job_id": w.job_id,
                "topic": w.topic,
                "started_at": w.started_at.isoformat() if w.started_at else None,
                "elapsed_s": round((now - w.started_at).total_seconds(), 3)
                if w.started_at
                else None,
            }
            for w in row.workers
        ],
    }


def render(rows: list[SupervisorRow], now: datetime) -> str:
    """One line per supervisor, one indented line per worker."""
    if not rows:
        return "no live supervisor against this database"
    lines = [
        f"{'holder':<34} {'host':<16} {'pid':>7}  {'topics':<24} {'job':<36} "
        f"{'elapsed':>8}  last seen"
    ]
    for row in rows:
        dead = "" if row.alive else "  (not seen lately: dead?)"
        lines.append(
            f"{safe(row.holder):<34} {safe(row.host):<16} {row.pid:>7}  "
            f"{safe(','.join(row.topics)):<24} {'':<36} {'':>8}  "
            f"{ago(row.seen_at, now)} ago{dead}"
            + (f"  version {safe(row.app_version)}" if row.app_version else "")
        )
        for w in row.workers:
            job = safe(w.job_id) if w.job_id else "idle"
            lines.append(
                f"{'  worker ' + str(w.slot):<34} {safe(row.host):<16} {w.pid:>7}  "
                f"{safe(w.topic or ''):<24} {job:<36} "
                f"{ago(w.started_at, now) if w.started_at else '-':>8}"
            )
    return "\n".join(lines)


def version_rows(inspection: Inspection) -> list[dict[str, Any]]:
    """Jobs not started yet per topic and app version, as JSON-friendly values."""
    return [asdict(v) for v in inspection.pending_by_version()]


def render_versions(versions: list[dict[str, Any]], live: list[SupervisorRow]) -> str:
    """Jobs not started yet per app version, and which live supervisors claim them: a
    version no live supervisor serves is said loudly (its jobs wait for one, or for
    ``brooq jobs retarget``)."""
    totals: dict[str | None, int] = {}
    for v in versions:
        totals[v["app_version"]] = totals.get(v["app_version"], 0) + v["jobs"]
    lines = ["jobs not started yet, by app version:"]
    for version, jobs in sorted(totals.items(), key=lambda kv: (kv[0] is not None, kv[0] or "")):
        if version is None:
            claimers = len(live)  # every supervisor claims unversioned jobs
        else:
            claimers = sum(1 for r in live if r.app_version == version)
        name = safe(version) if version is not None else "(unversioned)"
        note = f"{claimers} live supervisor{'s' * (claimers != 1)}"
        if not claimers:
            note = "NO LIVE SUPERVISOR of this version (brooq jobs retarget moves them)"
        lines.append(f"  {name:<24} {jobs:>10}  {note}")
    return "\n".join(lines)
