"""``brooq migrate up|down|status``: the schema's migrations, a deploy step."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from brooq.cli.common import require_dsn
from brooq.cli.errors import UsageError
from brooq.config import Settings


def register(sub: Any) -> None:
    """Add the migrate command."""
    p = sub.add_parser("migrate", help="apply, roll back or list schema migrations")
    p.add_argument(
        "action",
        choices=["up", "down", "status"],
        help="up: apply pending; down: roll back; status: list with their state",
    )
    p.add_argument("--steps", type=int, default=1, help="down: how many to roll back (default 1)")
    p.add_argument("--all", action="store_true", help="down: roll back every migration")
    p.set_defaults(func=cmd_migrate, needs_schema=False)


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply, roll back or list the schema migrations."""
    from brooq.postgres import migrations

    logging.getLogger("yoyo").setLevel(logging.WARNING)  # we print what was applied ourselves
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps}: give a number of migrations, 1 or more")
    dsn = require_dsn(settings)
    if args.action == "up":
        applied = migrations.up(dsn)
        print("\n".join(f"applied {m}" for m in applied) or "up to date")
    elif args.action == "down":
        rolled = migrations.down(dsn, steps=None if args.all else args.steps)
        print("\n".join(f"rolled back {m}" for m in rolled) or "nothing to roll back")
    else:
        for status in migrations.status(dsn):
            print(f"{'applied' if status.applied else 'pending':8} {status.id}")
    return 0
