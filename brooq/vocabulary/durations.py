"""Durations with units (``120s``, ``2m``, ``720h``): parsing, formatting, coercion."""

from __future__ import annotations

import re
from datetime import timedelta

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_FORMAT_ORDER = (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))


def parse_duration(text: str) -> timedelta:
    """Parse ``1h30m``, ``500ms``, ``1.5s`` or a bare ``0`` into a timedelta.

    A bare number other than zero is rejected: the unit must be explicit.
    Raises ValueError saying what to write instead.
    """
    s = text.strip()
    if s == "0":
        return timedelta(0)
    if re.fullmatch(r"-?\d+(?:\.\d+)?", s):
        return _raise(f"{text!r} has no unit; write e.g. {s}s, 2m or 1h")
    if s.startswith("-"):
        return _raise(f"{text!r} is negative; durations are zero or more")
    pos, total_ms = 0, 0.0
    for match in _PART_RE.finditer(s):
        if match.start() != pos:
            break
        total_ms += float(match.group(1)) * _UNIT_MS[match.group(2)]
        pos = match.end()
    if pos != len(s) or pos == 0:
        return _raise(f"{text!r} is not a duration; write e.g. 500ms, 30s, 2m, 1h30m or 720h")
    return timedelta(milliseconds=total_ms)


def _raise(message: str) -> timedelta:
    raise ValueError(message)


def format_duration(value: timedelta) -> str:
    """Format a duration in the shortest exact unit form, e.g. ``2m``, ``1h30m``, ``0``."""
    ms = round(value.total_seconds() * 1000)
    if ms == 0:
        return "0"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    parts = []
    for unit, size in _FORMAT_ORDER:
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return sign + "".join(parts)


def coerce_duration(value: object, *, name: str) -> timedelta:
    """Turn a timedelta, a number of seconds or a string with units into a timedelta.

    Raises ValueError naming ``name`` for booleans, negative values and bare
    numbers in strings.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}: {value!r} is not a duration; use a timedelta, seconds or '30s'")
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float):
        result = timedelta(seconds=value)
    elif isinstance(value, str):
        try:
            result = parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    else:
        raise ValueError(
            f"{name}: {type(value).__name__} is not a duration; use a timedelta, seconds or '30s'"
        )
    if result < timedelta(0):
        raise ValueError(f"{name}: {format_duration(result)} is negative")
    return result
