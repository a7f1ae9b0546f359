"""Where settings come from, lowest to highest precedence: built-in defaults < TOML file
< `.env` file < process environment < systemd credentials (`$CREDENTIALS_DIRECTORY`)
< command-line overrides. An empty value counts as unset. Every problem is
collected and reported at once in a `ConfigError`.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from brooq.config.settings import BY_ENV, BY_NAME, KEYS, Settings, order_problems
from brooq.config.values import ConfigError

CREDENTIAL_FILES = {"database-url": "DATABASE_URL", "brooq-token": "BROOQ_TOKEN"}
"""Files of $CREDENTIALS_DIRECTORY (systemd LoadCredential=) and the setting each holds."""


@dataclass
class _Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def problem(self, where: str, text: str) -> None:
        self.problems.append(f"{where}: {text}")

    def unknown(self, name: str, where: str, *, is_error: bool = False) -> None:
        close = difflib.get_close_matches(name, list(BY_NAME), n=1)
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
        ("default", {key.env: key.default for key in KEYS if key.default is not None}),
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
    return Settings(values, tuple(report.warnings), sources)


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
        key = BY_NAME.get(name)
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
        if name.startswith("QUEUE_") and name not in BY_ENV:
            report.unknown(name, where)
    return {name: env[name] for name in BY_ENV if name in env}


def _read_credentials(env: Mapping[str, str], report: _Report) -> dict[str, str]:
    """Secrets passed by systemd's LoadCredential= (files in $CREDENTIALS_DIRECTORY)."""
    directory = env.get("CREDENTIALS_DIRECTORY", "")
    found: dict[str, str] = {}
    if not directory:
        return found
    for filename, name in CREDENTIAL_FILES.items():
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
    for key in KEYS:
        text = raw.get(key.env)
        try:
            values[key.attr] = None if text is None else key.parse(text)
        except ValueError as exc:
            report.problem(key.env, str(exc))
    return values


def _check_order(values: Mapping[str, Any], report: _Report) -> None:
    for env, problem in order_problems(values):
        report.problem(env, problem)


def _compute(values: dict[str, Any], sources: dict[str, str]) -> None:
    """Fill the settings whose default depends on others (unset, or 0 meaning automatic)."""
    for key in KEYS:
        if key.computed is not None and not values[key.attr]:
            values[key.attr] = key.computed(values)
            sources[key.env] = "computed"
