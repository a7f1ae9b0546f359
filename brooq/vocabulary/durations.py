"""Durations with units (``120s``, ``2m``, ``720h``): parsing, formatting, coercion."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from fractions import Fraction

_ZERO = timedelta(0)
MAX_DURATION = timedelta(days=365)
"""The longest duration a setting or kind option takes: longer ones overflow timestamps."""
_MICROS = {"ms": 10**3, "s": 10**6, "m": 60 * 10**6, "h": 3600 * 10**6, "d": 86400 * 10**6}
# Output stops at hours on purpose (like Go): `720h` reads as "30 days" to operators.
_SHOWN_MICROS = (("h", _MICROS["h"]), ("m", _MICROS["m"]), ("s", _MICROS["s"]))
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_BARE_NUMBER = re.compile(rf"[+-]?{_NUMBER}")
_DURATION = re.compile(rf"(?:{_NUMBER}(?:ms|s|m|h|d))+")
_DURATION_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)")


def parse_duration(text: str) -> timedelta:
    """Parse `120s`, `2m`, `1h30m`, `500ms`, `1.5s`, `2d` (units ms, s, m, h, d).

    A leading sign is allowed; bare `0` is zero. Any other number without a
    unit raises ValueError, as does anything that is not a duration: spaces
    around it or digits of another script than ASCII (``"٥s"``) too. (Settings
    are stripped where they are read: a file's padding is not the value's.)
    """
    body = text.strip()
    if body != text:
        raise ValueError(f"{text!r} has spaces around it; write it without, e.g. {body or '90s'}")
    sign, unsigned = (-1, body[1:]) if body.startswith("-") else (1, body.removeprefix("+"))
    if unsigned == "0":
        return _ZERO
    if _BARE_NUMBER.fullmatch(body):
        raise ValueError(f'"{body}" has no unit; write e.g. {unsigned}s, 2m or 1h')
    if not _DURATION.fullmatch(unsigned):
        raise ValueError(
            f'"{body}" is not a duration; write numbers of ASCII digits with units '
            "(ms, s, m, h, d), e.g. 90s or 1h30m"
        )
    micros = sum(Fraction(n) * _MICROS[unit] for n, unit in _DURATION_PART.findall(unsigned))
    try:
        return timedelta(microseconds=sign * round(micros))
    except OverflowError:
        raise ValueError(f'"{body}" is too long; write at most 8760h (365 days)') from None


def format_duration(td: timedelta) -> str:
    """Canonical text for `td`: hours, minutes, seconds, then milliseconds.

    Examples: `2m`, `1h30m`, `500ms`, `720h`, `1s500ms`, `0s`. Exact (sub-ms
    parts become fractional ms) and `parse_duration(format_duration(td)) == td`.
    """
    micros = td // timedelta(microseconds=1)
    if micros == 0:
        return "0s"
    rest, parts = abs(micros), []
    for unit, size in _SHOWN_MICROS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    if rest:
        whole, frac = divmod(rest, 1000)
        parts.append((f"{whole}.{frac:03d}".rstrip("0") if frac else str(whole)) + "ms")
    return ("-" if micros < 0 else "") + "".join(parts)


def coerce_duration(value: timedelta | int | float | str, *, name: str) -> timedelta:
    """A timedelta in ``[0, 365 days]`` from a timedelta, seconds or a string with units.

    Raises ValueError naming `name` for booleans, bare-number strings,
    negative, infinite or NaN values and any other type.
    """
    try:
        td = _to_timedelta(value)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{name}: {exc}") from None
    if td < _ZERO:
        raise ValueError(f"{name}: must not be negative (got {format_duration(td)})")
    if td > MAX_DURATION:
        raise ValueError(
            f"{name}: {format_duration(td)} is longer than 365 days; write at most 8760h"
        )
    return td


def _to_timedelta(value: object) -> timedelta:
    # bool is an int subclass: `attempt_timeout=True` is a bug, not one second.
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean; write e.g. 30 or '30s'")
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number of seconds")
        try:
            return timedelta(seconds=value)
        except OverflowError:
            raise ValueError(f"{value} seconds is too long; give at most 999999999 days") from None
    if isinstance(value, str):
        return parse_duration(value)
    raise ValueError(
        f"expected a timedelta, seconds or a string like '2m', got {type(value).__name__}"
    )
