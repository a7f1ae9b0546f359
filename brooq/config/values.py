"""The syntax of setting values: durations, sizes, addresses, counts, choices, booleans.

Each *kind* parses the text of an environment variable (TOML values and flags
arrive as text too) and says, when it cannot, what is wrong and what to write
instead. Bounds live here too, so that a value that would break at run time
(a 999999999-day backoff overflowing PostgreSQL's timestamps) is refused at
start.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from fractions import Fraction
from typing import Any, Generic, TypeVar

from brooq.postgres.dsn import looks_like_dsn
from brooq.vocabulary import InvalidInput, topic_problem
from brooq.vocabulary.durations import MAX_DURATION, format_duration, parse_duration
from brooq.vocabulary.versions import InvalidAppVersion, app_version

T = TypeVar("T")

_ZERO = timedelta(0)
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_BARE_NUMBER = re.compile(rf"[+-]?{_NUMBER}")
_SIZE = re.compile(rf"({_NUMBER})\s*([A-Za-z]+)")
_SIZE_UNITS = {
    "TiB": 2**40, "GiB": 2**30, "MiB": 2**20, "KiB": 2**10,
    "TB": 10**12, "GB": 10**9, "MB": 10**6, "kB": 10**3, "B": 1,
}  # fmt: skip
_SIZE_BY_LOWER = {unit.lower(): factor for unit, factor in _SIZE_UNITS.items()}
_ADDR = re.compile(r"(\[[^\[\]\s]+\]|[^:\[\]\s]+):([0-9]{1,5})")
_BOOLS = {"true": True, "1": True, "yes": True, "on": True,
          "false": False, "0": False, "no": False, "off": False}  # fmt: skip
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*|[0-9a-f:.]+")
_WEIGHTED = re.compile(r"\s*([^=,\s]+)\s*=\s*([0-9]+)\s*")
MAX_INT = 2**31 - 1  # PostgreSQL integer columns and LIMITs take no more
MIN_TOKEN_BYTES = 32
"""The shortest BROOQ_TOKEN: anything shorter could be guessed."""


class ConfigError(InvalidInput):
    """Invalid settings; ``problems`` holds every one, str() shows one ``KEY: ...`` line each."""

    def __init__(self, problems: list[str], warnings: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)
        # Kept because a misspelt key often explains a problem (a value that never applied).
        self.warnings = tuple(warnings)


def parse_size(text: str) -> int:
    """Bytes from `512MiB`, `1GiB`, `200MB`, `64kB`, `100B` (unit case ignored); bare `0` is 0.

    Any other number without a unit raises ValueError: `512` could mean bytes or MiB.
    """
    body = text.strip()
    if body == "0":
        return 0
    if _BARE_NUMBER.fullmatch(body):
        raise ValueError(f'"{body}" has no unit; write e.g. {body}MiB or {body}MB')
    match = _SIZE.fullmatch(body)
    if match is None or match[2].lower() not in _SIZE_BY_LOWER:
        raise ValueError(
            f'"{body}" is not a size; write a number with a unit '
            "(B, kB, MB, GB, KiB, MiB, GiB), e.g. 512MiB"
        )
    size = Fraction(match[1]) * _SIZE_BY_LOWER[match[2].lower()]
    # Rounding would turn "0.4B" into 0, which means "unlimited" for memory.
    if size.denominator != 1:
        raise ValueError(f'"{body}" is not a whole number of bytes; write e.g. 512KiB')
    return int(size)


def format_size(n: int) -> str:
    """Shortest exact text for `n` bytes (`1MiB`, `200MB`, `1023B`, `0`); parse_size inverts it."""
    if n < 0:
        raise ValueError(f"a size cannot be negative (got {n})")
    if n == 0:
        return "0"
    exact = [f"{n // factor}{unit}" for unit, factor in _SIZE_UNITS.items() if n % factor == 0]
    return min(exact, key=len)  # on a tie the binary unit wins: it comes first


def parse_addr(text: str) -> tuple[str, int]:
    """Split `host:port` (IPv6: `[::1]:8090`) into host and port; port 0 picks a free port.

    The one address parser of brooq (settings and the HTTP surface use it).
    """
    match = _ADDR.fullmatch(text.strip())
    if match is None or not 0 <= int(match[2]) <= 65535:
        raise ValueError(f'"{text}" is not host:port; write e.g. 127.0.0.1:8090 or [::1]:8090')
    return match[1].strip("[]"), int(match[2])


# --- kinds ------------------------------------------------------------------------

# A parser takes the text and an example to suggest.
Parser = Callable[[str, str], T]


@dataclass(frozen=True)
class Kind(Generic[T]):
    """How the values of one kind of setting are read and shown."""

    parse: Parser[T]
    show: Callable[[Any], str] = str
    native_toml: bool = False  # ints and bools are written as TOML ints and bools
    metavar: str = "VALUE"


def duration(*, zero_ok: bool, at_least: timedelta | None = None, why: str = "") -> Kind[timedelta]:
    """A duration with units, positive (or zero when ``zero_ok``), at most MAX_DURATION, and
    at least ``at_least`` unless zero (``why`` says what a shorter one would break)."""

    def parse(text: str, example: str) -> timedelta:
        value = parse_duration(text)
        if value < _ZERO or (value == _ZERO and not zero_ok):
            rule = "must not be negative" if zero_ok else "must be greater than 0"
            raise ValueError(f'{rule} (got "{text}"); write e.g. {example}')
        if at_least is not None and _ZERO < value < at_least:
            raise ValueError(
                f'"{text}" is shorter than {format_duration(at_least)}{why}; write e.g. {example}'
            )
        if value > MAX_DURATION:
            raise ValueError(
                f'"{text}" is longer than {format_duration(MAX_DURATION)} (365 days); '
                f"write e.g. {example}"
            )
        return value

    return Kind(parse, format_duration, metavar="DURATION")


def size(*, zero_ok: bool, at_most: int = 2**50, why: str = "") -> Kind[int]:
    """A size with units (bytes), positive unless ``zero_ok``, at most ``at_most`` (``why``
    says what a larger one would break)."""

    def parse(text: str, example: str) -> int:
        value = parse_size(text)
        if value == 0 and not zero_ok:
            raise ValueError(f"must be greater than 0; write e.g. {example}")
        if value > at_most:
            raise ValueError(
                f'"{text}" is larger than {format_size(at_most)}{why}; write e.g. {example}'
            )
        return value

    return Kind(parse, format_size, metavar="SIZE")


def integer(low: int, high: int = MAX_INT) -> Kind[int]:
    """A whole number in ``[low, high]``."""

    def parse(text: str, example: str) -> int:
        if not re.fullmatch(r"[+-]?[0-9]{1,30}", text):
            raise ValueError(f'"{text[:40]}" is not a whole number; write e.g. {example}')
        if int(text) < low:
            raise ValueError(f"must be at least {low} (got {text}); write e.g. {example}")
        if int(text) > high:
            raise ValueError(f"must be at most {high} (got {text}); write e.g. {example}")
        return int(text)

    return Kind(parse, str, native_toml=True, metavar="N")


def choice(*options: str) -> Kind[str]:
    """One of ``options`` (case ignored)."""

    def parse(text: str, example: str) -> str:
        if text.lower() not in options:
            raise ValueError(f'"{text[:40]}" is not allowed; write one of {", ".join(options)}')
        return text.lower()

    return Kind(parse, metavar="{" + ",".join(options) + "}")


def _parse_bool(text: str, example: str) -> bool:
    if text.lower() not in _BOOLS:
        raise ValueError(f'"{text[:40]}" is not a boolean; write true or false')
    return _BOOLS[text.lower()]


def _parse_addr(text: str, example: str) -> str:
    parse_addr(text)
    return text


def _parse_dsn(text: str, example: str) -> str:
    # The message must not echo `text`: it may hold a password.
    if not looks_like_dsn(text):
        raise ValueError(f"not a postgres URL (value hidden); write e.g. {example}")
    return text


def _parse_text(text: str, example: str) -> str:
    return text


def token_problem(token: str) -> str | None:
    """Why ``token`` is too weak to guard anything (never quoting it), or None."""
    size = len(token.encode("utf-8", "surrogateescape"))
    advice = "e.g. the output of `openssl rand -hex 32`"
    if size < MIN_TOKEN_BYTES:
        return (
            f"{size} bytes is too short for a secret: use at least {MIN_TOKEN_BYTES} bytes, "
            + advice
        )
    if len(set(token)) == 1:
        return f"one character repeated is no secret: use {advice}"
    return None


def _parse_token(text: str, example: str) -> str:
    # The message must not echo `text`: it is the secret.
    if problem := token_problem(text):
        raise ValueError(problem)
    return text


def _parse_workers(text: str, example: str) -> int | str:
    """A count (``8``) or weighted ``topic=count`` pairs, kept as text for the supervisor."""
    if text.isdigit():
        return integer(1, 10_000).parse(text, example)
    pairs = [_WEIGHTED.fullmatch(part) for part in text.split(",")]
    if not all(pairs):
        raise ValueError(
            f'"{text[:60]}" is not a count (8) or topic=count pairs (email.send=4,report=2)'
        )
    for match in pairs:
        assert match is not None
        if problem := topic_problem(match[1]):
            raise ValueError(problem)
    if sum(int(m[2]) for m in pairs if m) < 1:
        raise ValueError("must add up to at least 1 worker")
    return ",".join(f"{m[1]}={int(m[2])}" for m in pairs if m)


def _parse_topics(text: str, example: str) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in text.split(",") if t.strip())
    for topic in topics:
        if problem := topic_problem(topic):
            raise ValueError(problem)
    return topics


def _parse_hosts(text: str, example: str) -> tuple[str, ...]:
    names = tuple(n.strip().lower().rstrip(".") for n in text.split(",") if n.strip())
    for name in names:
        if not _HOST_NAME.fullmatch(name):
            raise ValueError(
                f'"{name[:60]}" is not a host name; write names without port or scheme, '
                f"e.g. {example}"
            )
    return names


def _parse_app_version(text: str, example: str) -> str:
    try:
        version = app_version(text.strip())
    except InvalidAppVersion as exc:
        raise ValueError(f"{exc}; write e.g. {example}") from None
    assert version is not None  # an empty value is unset before it is parsed
    return version


APP_VERSION = Kind(_parse_app_version, metavar="VERSION")
BOOL = Kind(_parse_bool, lambda b: "true" if b else "false", native_toml=True,
            metavar="{true,false}")  # fmt: skip
ADDR = Kind(_parse_addr, metavar="HOST:PORT")
DSN = Kind(_parse_dsn, metavar="URL")
TEXT = Kind(_parse_text)
TOKEN = Kind(_parse_token)
WORKERS = Kind(_parse_workers, native_toml=True, metavar="N|TOPIC=N,...")
TOPICS = Kind(_parse_topics, ",".join, metavar="TOPIC,...")
HOSTS = Kind(_parse_hosts, ",".join, metavar="NAME,...")
