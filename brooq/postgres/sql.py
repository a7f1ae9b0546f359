"""Loads the named statements of queries.sql once, so SQL stays readable as SQL.

A `-- fragment: name` block is a piece several statements share (the ready-row
condition, the claim order, what a claim writes); `{{name}}` in a statement is
replaced by the fragment's text at load time (a fragment may use fragments too),
so each piece is written once.
Statement names are always literal strings at the call site (``sql("claim_topic")``),
so grep finds every use.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

_BLOCK_RE = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_USE_RE = re.compile(r"\{\{(\w+)\}\}")
_COMMENT_RE = re.compile(r"^\s*--.*$\n?", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Every statement of ``text`` by name, fragments expanded.

    Raises ValueError for a name defined twice or an unknown fragment.
    """
    parts = _BLOCK_RE.split(text)
    fragments: dict[str, str] = {}
    statements: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        target = fragments if kind == "fragment" else statements
        if name in fragments or name in statements:
            raise ValueError(f"queries.sql defines {name!r} twice")
        # Comments say why, for the reader of queries.sql; sent with every statement
        # they would only cost bytes (and a %(x)s in one would still be a placeholder).
        target[name] = _COMMENT_RE.sub("", body).strip()

    def expand(match: re.Match[str]) -> str:
        try:  # a fragment may use fragments too
            return _USE_RE.sub(expand, fragments[match[1]])
        except KeyError:
            raise ValueError(f"queries.sql uses an unknown fragment {match[1]!r}") from None

    return {name: _USE_RE.sub(expand, body) for name, body in statements.items()}


@cache
def statements() -> dict[str, str]:
    """Every statement of queries.sql by name."""
    return parse(files("brooq.postgres").joinpath("queries.sql").read_text(encoding="utf-8"))


def sql(name: str) -> str:
    """The statement called ``name``; KeyError names the missing statement."""
    try:
        return statements()[name]
    except KeyError:
        raise KeyError(f"queries.sql has no statement named {name!r}") from None
