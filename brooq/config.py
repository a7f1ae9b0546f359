"""brooq settings: one validated, immutable `Settings` built from every source.

Sources, lowest to highest precedence: built-in defaults < TOML file < `.env`
file < process environment < systemd credentials (`$CREDENTIALS_DIRECTORY`)
< CLI overrides. An empty value counts as unset. Every problem is collected
and reported at once in a `ConfigError`; secrets (the DSN password, the bearer
token) never appear in errors, warnings, `repr` or `config show` output.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, TypedDict

import tomli_w
from dotenv import dotenv_values

from brooq.vocabulary.durations import coerce_duration, format_duration, parse_duration

__all__ = [
    "ConfigError",
    "KindDefaults",
    "Settings",
    "coerce_duration",
    "format_duration",
    "format_size",
    "load_settings",
    "parse_addr",
    "parse_duration",
    "parse_size",
    "redact_dsn",
    "settings_to_env",
    "settings_to_toml",
]

LogFormat = Literal["kv", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]

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
_REDACTED = "***"
_MIN_REAPER_PERIOD = timedelta(seconds=5)
_AUTO_RETENTION_PERIOD = timedelta(minutes=5)
_CREDENTIAL_FILES = {"database-url": "DATABASE_URL", "brooq-token": "BROOQ_TOKEN"}


class ConfigError(ValueError):
    """Invalid settings; `problems` holds every one, str() shows one `KEY: ...` line each."""

    def __init__(self, problems: list[str], warnings: Sequence[str] = ()) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)
        # Kept because a misspelt key often explains a problem (a value that never applied).
        self.warnings = tuple(warnings)


class KindDefaults(TypedDict):
    """Per-kind options that apply when a `@queue.kind(...)` call leaves them out."""

    max_attempts: int
    attempt_timeout: timedelta
    max_execution_timeout: timedelta
    backoff_base: timedelta
    backoff_max: timedelta


@dataclass(frozen=True, repr=False)
class Settings:
    """Validated settings. Durations are `timedelta`, sizes are int bytes.

    Build it with `load_settings()`: direct construction skips validation and
    does not compute `reaper_period`, `retention_period` or `watchdog_grace`.
    Zero means "unlimited" for `max_jobs_per_worker` and
    `max_memory_per_worker`, and "retention disabled" for `retention_ttl`.
    `warnings` (unknown keys) and `sources` (env name -> where the value came
    from: default, toml, .env, env, credentials, cli or computed) do not take
    part in equality. `repr()` redacts secrets.
    """

    database_url: str | None
    workers: int
    poll_interval: timedelta
    lease: timedelta
    attempt_timeout: timedelta
    max_execution_timeout: timedelta
    backoff_base: timedelta
    backoff_max: timedelta
    max_attempts: int
    reaper_period: timedelta
    retention_ttl: timedelta
    retention_batch: int
    retention_period: timedelta
    watchdog_grace: timedelta
    max_jobs_per_worker: int
    max_memory_per_worker: int
    max_payload_bytes: int
    notify: bool
    http_addr: str
    token: str | None
    log_format: LogFormat
    log_level: LogLevel
    warnings: tuple[str, ...] = field(default=(), compare=False)
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __repr__(self) -> str:
        shown = ", ".join(f"{key.attr}={_repr_value(self, key)}" for key in _KEYS)
        return f"Settings({shown})"

    def redacted_dsn(self) -> str | None:
        """The DSN with its password replaced by `***`; None when no DSN is set."""
        return None if self.database_url is None else redact_dsn(self.database_url)

    def kind_defaults(self) -> KindDefaults:
        """Defaults for every kind option that the handler's code does not set."""
        return KindDefaults(
            max_attempts=self.max_attempts,
            attempt_timeout=self.attempt_timeout,
            max_execution_timeout=self.max_execution_timeout,
            backoff_base=self.backoff_base,
            backoff_max=self.backoff_max,
        )


# --- value syntax -----------------------------------------------------------


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
    """Split `host:port` (IPv6: `[::1]:8090`) into host and port; port 0 picks a free port."""
    match = _ADDR.fullmatch(text.strip())
    if match is None or not 0 <= int(match[2]) <= 65535:
        raise ValueError(f'"{text}" is not host:port; write e.g. 127.0.0.1:8090 or [::1]:8090')
    return match[1].strip("[]"), int(match[2])


def redact_dsn(dsn: str) -> str:
    """`dsn` with any password replaced by `***`, in URL or libpq key=value form."""
    if not _is_url_dsn(dsn):
        return re.sub(r"(password\s*=\s*)('(?:\\.|[^'\\])*'|\S*)", rf"\1{_REDACTED}", dsn)
    scheme, _, rest = dsn.partition("://")
    head, sep, query = rest.partition("?")
    # rfind: an unencoded "@" inside the password must not end the userinfo early.
    userinfo, at, hostpart = head.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":" + _REDACTED
    query = re.sub(r"((?:^|&)password=)[^&#]*", rf"\1{_REDACTED}", query)
    return f"{scheme}://{userinfo}{at}{hostpart}{sep}{query}"


def _is_url_dsn(dsn: str) -> bool:
    return dsn.startswith(("postgres://", "postgresql://"))


def _is_dsn(dsn: str) -> bool:
    return _is_url_dsn(dsn) or re.search(r"(?:^|\s)(?:dbname|host)\s*=", dsn) is not None


# --- keys ---------------------------------------------------------------------

# A kind's parser takes the text and an example to suggest; its ValueError
# message says what is wrong and what to write instead.
_Parser = Callable[[str, str], Any]


@dataclass(frozen=True)
class _Kind:
    parse: _Parser
    show: Callable[[Any], str] = str
    native_toml: bool = False  # ints and bools are written as TOML ints and bools


def _duration_kind(*, zero_ok: bool) -> _Kind:
    def parse(text: str, example: str) -> timedelta:
        value = parse_duration(text)
        if value < _ZERO or (value == _ZERO and not zero_ok):
            rule = "must not be negative" if zero_ok else "must be greater than 0"
            raise ValueError(f'{rule} (got "{text}"); write e.g. {example}')
        return value

    return _Kind(parse, format_duration)


def _size_kind(*, zero_ok: bool) -> _Kind:
    def parse(text: str, example: str) -> int:
        value = parse_size(text)
        if value == 0 and not zero_ok:
            raise ValueError(f"must be greater than 0; write e.g. {example}")
        return value

    return _Kind(parse, format_size)


def _int_kind(low: int) -> _Kind:
    def parse(text: str, example: str) -> int:
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise ValueError(f'"{text}" is not a whole number; write e.g. {example}')
        if int(text) < low:
            raise ValueError(f"must be at least {low} (got {text}); write e.g. {example}")
        return int(text)

    return _Kind(parse, str, native_toml=True)


def _choice_kind(*options: str) -> _Kind:
    def parse(text: str, example: str) -> str:
        if text.lower() not in options:
            raise ValueError(f'"{text}" is not allowed; write one of {", ".join(options)}')
        return text.lower()

    return _Kind(parse)


def _parse_bool(text: str, example: str) -> bool:
    if text.lower() not in _BOOLS:
        raise ValueError(f'"{text}" is not a boolean; write true or false')
    return _BOOLS[text.lower()]


def _parse_addr_text(text: str, example: str) -> str:
    parse_addr(text)
    return text


def _parse_dsn(text: str, example: str) -> str:
    # The message must not echo `text`: it may hold a password.
    if not _is_dsn(text):
        raise ValueError(f"not a postgres URL (value hidden); write e.g. {example}")
    return text


def _parse_text(text: str, example: str) -> str:
    return text


_BOOL = _Kind(_parse_bool, lambda b: "true" if b else "false", native_toml=True)


@dataclass(frozen=True)
class _Key:
    env: str
    attr: str
    kind: _Kind
    default: str | None = None
    example: str = ""
    secret: bool = False

    @property
    def toml(self) -> str:
        """The key's TOML spelling: lowercase, without the QUEUE_ prefix."""
        return self.env.lower().removeprefix("queue_")

    def parse(self, text: str) -> Any:
        return self.kind.parse(text, self.example or self.default or "")


_POSITIVE = _duration_kind(zero_ok=False)
_KEYS = (
    _Key("DATABASE_URL", "database_url", _Kind(_parse_dsn), None,
         "postgresql://user@localhost:5432/app", secret=True),
    _Key("QUEUE_WORKERS", "workers", _int_kind(1), "2"),
    _Key("QUEUE_POLL_INTERVAL", "poll_interval", _POSITIVE, "1s"),
    _Key("QUEUE_LEASE", "lease", _POSITIVE, "2m"),
    _Key("QUEUE_ATTEMPT_TIMEOUT", "attempt_timeout", _POSITIVE, "1m"),
    _Key("QUEUE_MAX_EXECUTION_TIMEOUT", "max_execution_timeout", _POSITIVE, "5m"),
    _Key("QUEUE_BACKOFF_BASE", "backoff_base", _POSITIVE, "1s"),
    _Key("QUEUE_BACKOFF_MAX", "backoff_max", _POSITIVE, "1m"),
    _Key("QUEUE_MAX_ATTEMPTS", "max_attempts", _int_kind(1), "5"),
    _Key("QUEUE_REAPER_PERIOD", "reaper_period", _POSITIVE, None,
         "30s, or leave it unset for max(5s, lease/4)"),
    _Key("QUEUE_RETENTION_TTL", "retention_ttl", _duration_kind(zero_ok=True), "720h",
         "720h, or 0 to disable retention"),
    _Key("QUEUE_RETENTION_BATCH", "retention_batch", _int_kind(1), "1000"),
    _Key("QUEUE_RETENTION_PERIOD", "retention_period", _duration_kind(zero_ok=True), "0",
         "5m, or 0 for automatic"),
    _Key("QUEUE_WATCHDOG_GRACE", "watchdog_grace", _POSITIVE, None,
         "1m, or leave it unset to use the lease"),
    _Key("QUEUE_MAX_JOBS_PER_WORKER", "max_jobs_per_worker", _int_kind(0), "0",
         "1000, or 0 for unlimited"),
    _Key("QUEUE_MAX_MEMORY_PER_WORKER", "max_memory_per_worker", _size_kind(zero_ok=True), "0",
         "512MiB, or 0 for unlimited"),
    _Key("QUEUE_MAX_PAYLOAD_BYTES", "max_payload_bytes", _size_kind(zero_ok=False), "1MiB"),
    _Key("QUEUE_NOTIFY", "notify", _BOOL, "true"),
    _Key("HTTP_ADDR", "http_addr", _Kind(_parse_addr_text), "127.0.0.1:8090"),
    _Key("BROOQ_TOKEN", "token", _Kind(_parse_text), None, secret=True),
    _Key("LOG_FORMAT", "log_format", _choice_kind("kv", "json"), "kv"),
    _Key("LOG_LEVEL", "log_level", _choice_kind("debug", "info", "warning", "error"), "info"),
)  # fmt: skip
_BY_ENV = {key.env: key for key in _KEYS}
_BY_ATTR = {key.attr: key for key in _KEYS}
# Both spellings are accepted in TOML and in overrides.
_BY_NAME = {**_BY_ENV, **{key.toml: key for key in _KEYS}}
# A soft timeout above the hard one, or a base above the cap, can never take effect.
_ORDERED = (("attempt_timeout", "max_execution_timeout"), ("backoff_base", "backoff_max"))


def _repr_value(settings: Settings, key: _Key) -> str:
    value = getattr(settings, key.attr)
    return repr(_shown(key, value) if key.secret else value)


def _shown(key: _Key, value: Any) -> str | None:
    """Text of one value as `config show` prints it, secrets redacted."""
    if value is None:
        return None
    if key.secret:
        return redact_dsn(value) if key.attr == "database_url" else _REDACTED
    return key.kind.show(value)


# --- sources ------------------------------------------------------------------


@dataclass
class _Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def problem(self, where: str, text: str) -> None:
        self.problems.append(f"{where}: {text}")

    def unknown(self, name: str, where: str, *, is_error: bool = False) -> None:
        close = difflib.get_close_matches(name, list(_BY_NAME), n=1)
        if is_error:
            self.problem(
                name, f"unknown setting in {where}; use {close[0] if close else 'a known key'}"
            )
        else:
            hint = f"did you mean {close[0]}?" if close else "ignored"
            self.warnings.append(f"{name}: unknown setting in {where}; {hint}")


def load_settings(
    *,
    environ: Mapping[str, str] | None = None,
    env_file: str | Path | None = ".env",
    toml_file: str | Path | None = None,
    overrides: Mapping[str, str | None] | None = None,
) -> Settings:
    """Read every source, validate, compute derived periods and return `Settings`.

    `environ` defaults to `os.environ` and is never modified; `.env` is read,
    not loaded into the environment. A missing `env_file` is fine only when it
    is the default `.env`; a missing TOML file (argument or `BROOQ_CONFIG`) is
    a problem. Raises `ConfigError` listing every problem found.
    """
    env = os.environ if environ is None else environ
    report = _Report()
    layers = (
        ("default", {key.env: key.default for key in _KEYS if key.default is not None}),
        ("toml", _read_toml(_toml_path(toml_file, env), report)),
        (".env", _read_dotenv(env_file, report)),
        ("env", _env_style(env, "env", report)),
        ("credentials", _read_credentials(env, report)),
        ("cli", _named(overrides or {}, "overrides", report, unknown_is_error=True)),
    )
    raw, sources = _merge(layers)
    values = _parse_all(raw, report)
    _check_order(values, report)
    if report.problems:
        raise ConfigError(report.problems, report.warnings)
    _compute(values, sources)
    return Settings(**values, warnings=tuple(report.warnings), sources=sources)


def _toml_path(toml_file: str | Path | None, env: Mapping[str, str]) -> Path | None:
    if toml_file is not None:
        return Path(toml_file)
    name = env.get("BROOQ_CONFIG", "").strip()
    return Path(name) if name else None


def _read_toml(path: Path | None, report: _Report) -> dict[str, str]:
    if path is None:
        return {}
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        report.problem(
            str(path), "TOML file not found; fix the path given by --config or BROOQ_CONFIG"
        )
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        report.problem(str(path), f"cannot read TOML ({exc}); fix the file")
        return {}
    return _named(data, f"TOML file {path}", report, unknown_is_error=False)


def _as_text(value: object) -> str | None:
    """A TOML or override value as the text an env var would hold; None for tables, arrays..."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    return None


def _named(
    items: Mapping[str, object], where: str, report: _Report, *, unknown_is_error: bool
) -> dict[str, str]:
    """Map names in either spelling (QUEUE_LEASE or lease) to env names; None means not given."""
    found: dict[str, str] = {}
    for name, value in items.items():
        key = _BY_NAME.get(name)
        text = _as_text(value)
        if key is None:
            report.unknown(name, where, is_error=unknown_is_error)
        elif value is None:
            continue
        elif text is None:
            report.problem(key.env, f"in {where}: expected a string, number or boolean")
        elif key.env in found:
            report.problem(key.env, f"set twice in {where} ({key.env} and {key.toml}); keep one")
        else:
            found[key.env] = text
    return found


def _read_dotenv(env_file: str | Path | None, report: _Report) -> dict[str, str]:
    if env_file is None:
        return {}
    path = Path(env_file)
    if not path.is_file():
        if path != Path(".env"):
            report.problem(str(path), ".env file not found; fix the path or leave it out")
        return {}
    try:
        values = dotenv_values(path)
    except (OSError, UnicodeDecodeError) as exc:
        report.problem(str(path), f"cannot read .env file ({type(exc).__name__}); fix the file")
        return {}
    return _env_style({k: v for k, v in values.items() if v is not None}, str(path), report)


def _env_style(env: Mapping[str, str], where: str, report: _Report) -> dict[str, str]:
    """Known keys of an environment; unknown QUEUE_* keys are warned about, others ignored."""
    for name in env:
        if name.startswith("QUEUE_") and name not in _BY_ENV:
            report.unknown(name, where)
    return {name: env[name] for name in _BY_ENV if name in env}


def _read_credentials(env: Mapping[str, str], report: _Report) -> dict[str, str]:
    """Secrets passed by systemd's LoadCredential= (files in $CREDENTIALS_DIRECTORY)."""
    directory = env.get("CREDENTIALS_DIRECTORY", "")
    found: dict[str, str] = {}
    if not directory:
        return found
    for filename, name in _CREDENTIAL_FILES.items():
        path = Path(directory, filename)
        try:
            found[name] = path.read_text(encoding="utf-8").rstrip("\r\n")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            # The exception's own text could quote the file's bytes: name the type only.
            report.problem(name, f"cannot read credential {path} ({type(exc).__name__})")
    return found


def _merge(layers: tuple[tuple[str, dict[str, str]], ...]) -> tuple[dict[str, str], dict[str, str]]:
    """Highest layer wins; an empty value is unset, so a lower layer shows through."""
    raw: dict[str, str] = {}
    sources: dict[str, str] = {}
    for label, values in layers:
        for name, text in values.items():
            if text.strip():
                raw[name], sources[name] = text.strip(), label
    return raw, sources


def _parse_all(raw: Mapping[str, str], report: _Report) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in _KEYS:
        text = raw.get(key.env)
        try:
            values[key.attr] = None if text is None else key.parse(text)
        except ValueError as exc:
            report.problem(key.env, str(exc))
    return values


def _check_order(values: Mapping[str, Any], report: _Report) -> None:
    for low, high in _ORDERED:
        small, big = values.get(low), values.get(high)
        if isinstance(small, timedelta) and isinstance(big, timedelta) and small > big:
            low_env, high_env = _BY_ATTR[low].env, _BY_ATTR[high].env
            report.problem(
                low_env,
                f"{format_duration(small)} is longer than {high_env} ({format_duration(big)}); "
                f"write at most {format_duration(big)} or raise {high_env}",
            )


def _compute(values: dict[str, Any], sources: dict[str, str]) -> None:
    """Fill the settings whose default depends on others."""
    automatic = {
        "reaper_period": max(_MIN_REAPER_PERIOD, values["lease"] / 4),
        "watchdog_grace": values["lease"],
        "retention_period": _AUTO_RETENTION_PERIOD,
    }
    for attr, value in automatic.items():
        if values[attr] in (None, _ZERO):
            values[attr] = value
            sources[_BY_ATTR[attr].env] = "computed"


# --- output -------------------------------------------------------------------


def _shown_items(settings: Settings) -> Iterator[tuple[_Key, str | None]]:
    for key in _KEYS:
        yield key, _shown(key, getattr(settings, key.attr))


def settings_to_env(settings: Settings) -> str:
    """`KEY=value` lines (dotenv syntax) for every setting; secrets redacted, unset as `KEY=`."""
    return "".join(f"{key.env}={_env_quote(text or '')}\n" for key, text in _shown_items(settings))


def _env_quote(text: str) -> str:
    # Same escaping as python-dotenv's set_key, so the output reads back unchanged.
    if re.fullmatch(r"[\w.:/@*+,=-]*", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def settings_to_toml(settings: Settings) -> str:
    """TOML with lowercase keys without the QUEUE_ prefix; secrets redacted, unset omitted."""
    table: dict[str, Any] = {}
    for key, text in _shown_items(settings):
        if text is not None:
            native = key.kind.native_toml and not key.secret
            table[key.toml] = getattr(settings, key.attr) if native else text
    return tomli_w.dumps(table)
