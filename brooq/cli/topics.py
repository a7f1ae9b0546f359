"""``brooq topics``: pause, resume and list topics, across every host.

A paused topic starts no new job on any supervisor (nor ``brooq work``) within a
second; its jobs are still enqueued, listed, canceled and retried, and wait as
``pending``. The pause is a row in the database: it survives every restart until
``brooq topics resume``.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from brooq.cli.common import print_json, require_dsn
from brooq.cli.text import safe
from brooq.cli.workers import ago
from brooq.config import Settings
from brooq.engine.inspection import TopicStateCount
from brooq.vocabulary import TopicPause, pause_request


def register(sub: Any) -> None:
    """Add ``brooq topics pause|resume|list``."""
    p = sub.add_parser("topics", help="pause, resume and list topics (every host)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    pause = actions.add_parser(
        "pause", help="no supervisor starts a new job of TOPIC until it is resumed"
    )
    pause.add_argument("topic", metavar="TOPIC", help="the topic to pause (a kind need not exist)")
    pause.add_argument("--reason", help="why (shown by list, status and the dashboard)")
    pause.add_argument("--json", action="store_true", help="the pause as one JSON object")
    pause.set_defaults(func=cmd_pause)
    resume = actions.add_parser("resume", help="let supervisors start jobs of TOPIC again")
    resume.add_argument("topic", metavar="TOPIC", help="the paused topic to resume")
    resume.add_argument("--json", action="store_true", help="one JSON object")
    resume.set_defaults(func=cmd_resume)
    listing = actions.add_parser(
        "list", help="every topic with jobs or a pause: state, reason, since, by whom"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object")
    listing.set_defaults(func=cmd_list)


def _store(settings: Settings) -> Any:
    from brooq.postgres.store import PostgresStore

    return PostgresStore(require_dsn(settings), notify=True)


def pause_json(p: TopicPause) -> dict[str, Any]:
    """A pause as JSON-friendly values."""
    return {
        "topic": p.topic,
        "state": "paused",
        "reason": p.reason,
        "paused_at": p.paused_at.isoformat(),
        "paused_by": p.paused_by,
    }


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    """Pause a topic (checked first: a name that is not a topic exits 2, nothing written)."""
    pause_request(args.topic, args.reason)
    store = _store(settings)
    try:
        pause = store.pause(args.topic, args.reason)
    finally:
        store.close()
    if args.json:
        print_json(pause_json(pause))
    else:
        why = f" ({safe(pause.reason)})" if pause.reason else ""
        print(
            f"paused {pause.topic}{why}: no supervisor starts a new job of it within 1s; "
            f"`brooq topics resume {pause.topic}` lets them go on"
        )
    return 0


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Resume a topic; saying so when it was not paused (exit 0 either way: it runs)."""
    pause_request(args.topic, None)
    store = _store(settings)
    try:
        lifted = store.resume(args.topic)
    finally:
        store.close()
    if args.json:
        print_json({"topic": args.topic, "state": "active", "was_paused": lifted is not None})
    elif lifted is None:
        print(f"{args.topic} was not paused")
    else:
        print(f"resumed {args.topic} (paused since {lifted.paused_at:%Y-%m-%d %H:%M:%S %Z})")
    return 0


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    """Every topic that has jobs or a pause, with its state and what waits."""
    from brooq.postgres.inspection import PostgresInspection

    inspection = PostgresInspection(require_dsn(settings))
    try:
        pauses, depth = inspection.pauses(), inspection.depth()
    finally:
        inspection.close()
    rows = topic_rows(pauses, depth)
    if args.json:
        print_json({"topics": rows})
    else:
        print(render(rows, datetime.now(UTC)))
    return 0


def topic_rows(pauses: list[TopicPause], depth: list[TopicStateCount]) -> list[dict[str, Any]]:
    """One row per topic with jobs or a pause, by name: state, pending jobs, the pause."""
    by_topic = {p.topic: p for p in pauses}
    pending: dict[str, int] = {}
    for row in depth:
        if row.state in ("pending", "failed"):
            pending[row.topic] = pending.get(row.topic, 0) + row.jobs
        else:
            pending.setdefault(row.topic, 0)
    rows = []
    for topic in sorted(by_topic.keys() | pending.keys()):
        p = by_topic.get(topic)
        rows.append(
            {
                "topic": topic,
                "state": "paused" if p else "active",
                "waiting": pending.get(topic, 0),
                "reason": p.reason if p else None,
                "paused_at": p.paused_at.isoformat() if p else None,
                "paused_by": p.paused_by if p else None,
            }
        )
    return rows


def render(rows: list[dict[str, Any]], now: datetime) -> str:
    """The table of ``brooq topics list``."""
    if not rows:
        return "no topic has jobs or a pause in this database"
    lines = [f"{'topic':<32} {'state':<7} {'waiting':>9}  {'since':>8}  {'by':<24} reason"]
    for r in rows:
        since = ago(datetime.fromisoformat(r["paused_at"]), now) if r["paused_at"] else "-"
        lines.append(
            f"{safe(r['topic']):<32} {r['state']:<7} {r['waiting']:>9}  {since:>8}  "
            f"{safe(r['paused_by'] or '-'):<24} {safe(r['reason'] or '-')}"
        )
    return "\n".join(lines)
