""".env.example is made from the settings table: every setting, its default and its help, read
back as exactly the defaults; a test fails when the file and the table drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from brooq.config import KEYS, env_example, load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / ".env.example"
ASSIGNMENT = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
SECRETS = {key.env for key in KEYS if key.secret}


def assignments() -> list[tuple[int, str, str]]:
    lines = EXAMPLE.read_text().splitlines()
    return [(n, m[1], m[2]) for n, line in enumerate(lines) if (m := ASSIGNMENT.match(line))]


def test_every_key_once_and_no_other() -> None:
    names = [name for _, name, _ in assignments()]
    assert sorted(names) == sorted(key.env for key in KEYS)


def test_every_key_shows_its_default() -> None:
    values = {name: value for _, name, value in assignments()}
    for key in KEYS:
        if key.env not in SECRETS:
            assert values[key.env] == (key.default or ""), key.env


def test_every_key_has_a_comment_above_it() -> None:
    lines = EXAMPLE.read_text().splitlines()
    for n, name, _ in assignments():
        above = lines[n - 1]
        assert above.startswith("# ") or ASSIGNMENT.match(above), f"{name} has no comment"


def test_the_token_is_a_placeholder_and_systemd_credentials_are_mentioned() -> None:
    values = {name: value for _, name, value in assignments()}
    assert values["BROOQ_TOKEN"] == ""
    text = EXAMPLE.read_text()
    assert "LoadCredential" in text and "CREDENTIALS_DIRECTORY" in text


def test_it_reads_back_as_the_defaults() -> None:
    dsn = dict((name, value) for _, name, value in assignments())["DATABASE_URL"]
    from_file = load_settings(environ={}, env_file=EXAMPLE)
    defaults = load_settings(environ={"DATABASE_URL": dsn}, env_file=None)
    assert from_file.warnings == ()
    assert from_file == defaults


def test_the_file_is_what_the_table_makes() -> None:
    """Regenerate with `brooq config example > .env.example` after changing a setting."""
    assert EXAMPLE.read_text() == env_example()
