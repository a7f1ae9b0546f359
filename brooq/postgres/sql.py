"""Loads the named statements of queries.sql once, so SQL stays readable as SQL."""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def statements() -> dict[str, str]:
    """Every statement of queries.sql by name."""
    text = files("brooq.postgres").joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME_RE.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def sql(name: str) -> str:
    """The statement called ``name``; KeyError names the missing statement."""
    try:
        return statements()[name]
    except KeyError:
        raise KeyError(f"queries.sql has no statement named {name!r}") from None
