"""``brooq config show|example``: the effective settings, or the .env.example of the table."""

from __future__ import annotations

import argparse
from typing import Any

from brooq.config import Settings, env_example, settings_to_env, settings_to_toml


def register(sub: Any) -> None:
    """Add the config command."""
    p = sub.add_parser("config", help="print the effective configuration (secrets redacted)")
    p.add_argument(
        "action",
        choices=["show", "example"],
        help="show: what is in effect; example: every setting with its help "
        "(the text of .env.example)",
    )
    p.add_argument(
        "--format", choices=["env", "toml"], default="env", help="show: dotenv (default) or TOML"
    )
    p.set_defaults(func=cmd_config, needs_schema=False)


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """Print the effective configuration, secrets redacted, or the example file."""
    if args.action == "example":
        print(env_example(), end="")
    elif args.format == "toml":
        print(settings_to_toml(settings), end="")
    else:
        print(settings_to_env(settings), end="")
    return 0
