"""Settings as text: `config show` (env or TOML, secrets redacted) and `.env.example`."""

from __future__ import annotations

import re
from typing import Any

import tomli_w

from brooq.config.settings import KEYS, SECTIONS, Key, Settings


def settings_to_env(settings: Settings) -> str:
    """`KEY=value` lines (dotenv syntax) for every setting; secrets redacted, unset as `KEY=`."""
    return "".join(
        f"{key.env}={_env_quote(key.shown(value) or '')}\n" for key, value in settings.items()
    )


def _env_quote(text: str) -> str:
    # Same escaping as python-dotenv's set_key, so the output reads back unchanged.
    if re.fullmatch(r"[\w.:/@*+,=-]*", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def settings_to_toml(settings: Settings) -> str:
    """TOML with lowercase keys without the QUEUE_ prefix; secrets redacted, unset omitted."""
    table: dict[str, Any] = {}
    for key, value in settings.items():
        text = key.shown(value)
        if text is not None:
            native = key.kind.native_toml and not key.secret
            table[key.toml] = value if native else text
    return tomli_w.dumps(table)


ENV_EXAMPLE_HEADER = """\
# brooq settings. Copy to .env (gitignored) for local work, with the URL of the local
# database (scripts/pg.sh url follows BROOQ_PGPORT; the later DATABASE_URL line wins):
#   cp .env.example .env && echo "DATABASE_URL=$(scripts/pg.sh url)" >> .env
# Generated from brooq/config/settings/ by `brooq config example`; a test fails
# when this file and the table differ. `brooq config show` prints what is in
# effect (secrets redacted).
#
# Precedence, lowest to highest: defaults < TOML file (--config or BROOQ_CONFIG)
# < .env < the process environment < systemd credentials < command-line flags.
# An empty value (KEY=) counts as unset: the default applies.
# Durations need units (500ms, 30s, 2m, 720h) and are at most 365 days; a bare
# number is rejected. Sizes need units too (512MiB, 200MB). Invalid values stop
# the command with every problem listed at once (exit code 2).
#
# Secrets (the database password, the bearer token) never go into a file in the
# repository. Under systemd they come through LoadCredential= (see
# systemd/brooq.service): brooq reads $CREDENTIALS_DIRECTORY/database-url and
# $CREDENTIALS_DIRECTORY/brooq-token, which win over the environment; the unit's
# EnvironmentFile (/etc/brooq/brooq.env) holds only the non-secret keys below.
"""

ENV_EXAMPLE_FOOTER = """
# A TOML file with the same keys (lowercase, without QUEUE_: lease = "2m") is
# read when named by --config or by BROOQ_CONFIG in the environment (not here).
"""

# The local throwaway database of `make db-up`, shown as the example DSN.
EXAMPLE_VALUES = {"DATABASE_URL": "postgresql://brooq:brooq@127.0.0.1:55433/brooq"}


def env_example() -> str:
    """The text of `.env.example`: every key once, its help as a comment, its default."""
    parts = [ENV_EXAMPLE_HEADER]
    for section, title in SECTIONS.items():
        parts.append(f"\n# --- {title} " + "-" * max(3, 76 - len(title)) + "\n")
        for key in (k for k in KEYS if k.section == section):
            parts.append(_example_entry(key))
    parts.append(ENV_EXAMPLE_FOOTER)
    return "".join(parts)


def _example_entry(key: Key[Any]) -> str:
    lines = _wrap(key.help)
    if key.commands and key.commands != ("global",):
        lines += _wrap(f"Flag: {key.flag} ({', '.join(key.commands)}).")
    value = EXAMPLE_VALUES.get(key.env, "" if key.secret else key.default or "")
    return "\n" + "".join(f"# {line}\n" for line in lines) + f"{key.env}={value}\n"


def _wrap(text: str, width: int = 86) -> list[str]:
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines
