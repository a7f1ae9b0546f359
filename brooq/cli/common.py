"""What every command shares: settings from flags, the database, JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from brooq.cli.errors import UsageError
from brooq.config import KEYS, Settings, load_settings
from brooq.config.settings import GLOBAL


def add_setting_flags(
    parser: argparse.ArgumentParser, command: str, *, after_command: bool = False
) -> None:
    """A flag for every setting that ``command`` takes, made from the settings table.

    ``after_command``: the flags repeated on a command's own parser, where an
    absent flag must not undo one given before the command.
    """
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if after_command else {}
    for key in KEYS:
        if command not in key.commands:
            continue
        default = f"default {key.default}" if key.default else "unset by default"
        help_text = f"{key.help} ({default}; env {key.env})"
        if key.kind.native_toml and key.kind.metavar == "{true,false}":
            parser.add_argument(
                key.flag,
                dest=key.attr,
                action="store_const",
                const="true",
                help=help_text,
                **unset,
            )
        else:
            parser.add_argument(
                key.flag,
                dest=key.attr,
                metavar=key.kind.metavar,
                help=help_text.replace("%", "%%"),
                **unset,
            )


def add_global_flags(parser: argparse.ArgumentParser, *, after_command: bool = False) -> None:
    """The flags of the top-level parser: configuration files and the global settings.

    ``after_command``: the same flags on a command's parser, so that they may
    follow the command as users type them (``brooq config show --config x.toml``).
    """
    if after_command:
        parser.add_argument(
            "--config", metavar="FILE", default=argparse.SUPPRESS, help="TOML configuration file"
        )
        parser.add_argument(
            "--env-file", metavar="FILE", default=argparse.SUPPRESS, help="dotenv file to read"
        )
    else:
        parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
        parser.add_argument(
            "--env-file",
            default=".env",
            metavar="FILE",
            help="dotenv file to read (default: .env when present)",
        )
    add_setting_flags(parser, GLOBAL, after_command=after_command)


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from every source, the flags given on this command line winning."""
    overrides = {key.env: getattr(args, key.attr, None) for key in KEYS}
    settings = load_settings(
        env_file=args.env_file,
        toml_file=args.config,
        overrides={k: v for k, v in overrides.items() if v is not None},
    )
    for warning in settings.warnings:
        print(f"brooq: warning: {warning}", file=sys.stderr)
    return settings


def require_dsn(settings: Settings) -> str:
    """DATABASE_URL, or a UsageError saying where to set it."""
    if not settings.database_url:
        raise UsageError(
            "DATABASE_URL is not set; set it in the environment, .env, the TOML file "
            "or $CREDENTIALS_DIRECTORY/database-url"
        )
    return settings.database_url


def print_json(value: Any) -> None:
    """One JSON document on a line."""
    print(json.dumps(value, default=str, ensure_ascii=False))
