"""Settings: sources and precedence, validation that lists every problem, secrets kept out."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brooq.config import (
    ConfigError,
    Settings,
    coerce_duration,
    format_duration,
    format_size,
    load_settings,
    parse_addr,
    parse_duration,
    parse_size,
    redact_dsn,
    settings_to_env,
    settings_to_toml,
)
from brooq.vocabulary import InvalidKindOptions, KindOptions

SECRET = "hunter2-s3cret"
TOKEN = "hunter2-s3cret-token-0123456789abcdef"
DSN = f"postgresql://app:{SECRET}@db.internal:5432/app"


def load(env: dict[str, str] | None = None, **kwargs: object) -> Settings:
    """Settings from `env` only: no .env, no TOML unless asked."""
    kwargs.setdefault("env_file", None)
    return load_settings(environ=env or {}, **kwargs)  # type: ignore[arg-type]


def problems(env: dict[str, str] | None = None, **kwargs: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(env, **kwargs)
    assert str(caught.value).splitlines() == caught.value.problems
    return caught.value.problems


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults and sources ----------------------------------------------------


def test_defaults() -> None:
    s = load()
    assert s.database_url is None and s.token is None
    assert s.workers == 2 and s.max_attempts == 5 and s.retention_batch == 1000
    assert s.poll_interval == timedelta(seconds=1)
    assert s.lease == timedelta(minutes=2)
    assert s.attempt_timeout == timedelta(minutes=1)
    assert s.max_execution_timeout == timedelta(minutes=5)
    assert (s.backoff_base, s.backoff_max) == (timedelta(seconds=1), timedelta(minutes=1))
    assert s.retention_ttl == timedelta(hours=720)
    assert s.max_jobs_per_worker == 0 and s.max_memory_per_worker == 0
    assert s.max_payload_bytes == 1024 * 1024
    assert s.notify is True
    assert s.http_addr == "127.0.0.1:8090"
    assert (s.log_format, s.log_level) == ("kv", "info")
    assert s.warnings == ()
    assert s.sources["QUEUE_LEASE"] == "default"


def test_precedence_toml_dotenv_env_cli(tmp_path: Path) -> None:
    toml = write(
        tmp_path / "b.toml", 'workers = 3\nlease = "3m"\nbackoff_max = "3m"\nmax_attempts = 3\n'
    )
    dotenv = write(tmp_path / "b.env", "QUEUE_WORKERS=4\nQUEUE_LEASE=4m\nQUEUE_BACKOFF_MAX=4m\n")
    env = {"QUEUE_WORKERS": "5", "QUEUE_LEASE": "5m"}
    s = load(env, toml_file=toml, env_file=dotenv, overrides={"QUEUE_WORKERS": "6"})
    assert s.workers == 6 and s.lease == timedelta(minutes=5)
    assert s.backoff_max == timedelta(minutes=4) and s.max_attempts == 3
    assert s.sources["QUEUE_WORKERS"] == "cli"
    assert s.sources["QUEUE_LEASE"] == "env"
    assert s.sources["QUEUE_BACKOFF_MAX"] == ".env"
    assert s.sources["QUEUE_MAX_ATTEMPTS"] == "toml"
    assert s.sources["QUEUE_POLL_INTERVAL"] == "default"


def test_overrides_accept_both_spellings_and_none_means_not_given() -> None:
    s = load({"QUEUE_LEASE": "5m"}, overrides={"workers": "7", "QUEUE_LEASE": None})
    assert s.workers == 7 and s.lease == timedelta(minutes=5)


def test_unknown_override_is_a_problem() -> None:
    assert problems(overrides={"workerz": "3"}) == [
        "workerz: unknown setting in overrides; use workers"
    ]


def test_empty_value_counts_as_unset(tmp_path: Path) -> None:
    dotenv = write(tmp_path / "b.env", "QUEUE_LEASE=3m\nQUEUE_WORKERS=\nQUEUE_NOTIFY\n")
    s = load({"QUEUE_LEASE": "", "QUEUE_MAX_ATTEMPTS": "  "}, env_file=dotenv,
             overrides={"QUEUE_LEASE": ""})  # fmt: skip
    assert s.lease == timedelta(minutes=3) and s.sources["QUEUE_LEASE"] == ".env"
    assert s.workers == 2 and s.max_attempts == 5 and s.notify is True


def test_dotenv_is_read_not_loaded_into_environ(tmp_path: Path) -> None:
    dotenv = write(tmp_path / "b.env", "QUEUE_WORKERS=9\n")
    env: dict[str, str] = {}
    assert load_settings(environ=env, env_file=dotenv).workers == 9
    assert env == {} and "QUEUE_WORKERS" not in os.environ


def test_default_dotenv_missing_is_fine_explicit_missing_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_settings(environ={}).workers == 2
    write(tmp_path / ".env", "QUEUE_WORKERS=3\n")
    assert load_settings(environ={}).workers == 3
    missing = tmp_path / "nope.env"
    assert problems(env_file=missing) == [
        f"{missing}: .env file not found; fix the path or leave it out"
    ]


# --- TOML --------------------------------------------------------------------


def test_toml_accepts_both_key_styles_and_native_types(tmp_path: Path) -> None:
    toml = write(tmp_path / "b.toml", (
        'QUEUE_LEASE = "90s"\nworkers = 4\nnotify = false\n'
        f'database_url = "{DSN}"\nQUEUE_MAX_MEMORY_PER_WORKER = "512MiB"\nlog_level = "debug"\n'
    ))  # fmt: skip
    s = load(toml_file=toml)
    assert s.lease == timedelta(seconds=90) and s.workers == 4 and s.notify is False
    assert s.database_url == DSN and s.max_memory_per_worker == 512 * 2**20
    assert s.log_level == "debug"


def test_toml_path_from_brooq_config(tmp_path: Path) -> None:
    toml = write(tmp_path / "b.toml", "workers = 5\n")
    assert load({"BROOQ_CONFIG": str(toml)}).workers == 5


def test_toml_missing_file_is_a_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    expected = f"{missing}: TOML file not found; fix the path given by --config or BROOQ_CONFIG"
    assert problems(toml_file=missing) == [expected]
    assert problems({"BROOQ_CONFIG": str(missing)}) == [expected]


def test_toml_durations_need_string_with_unit(tmp_path: Path) -> None:
    toml = write(tmp_path / "b.toml", "lease = 120\nworkers = [1]\n")
    assert problems(toml_file=toml) == [
        f"QUEUE_WORKERS: in TOML file {toml}: expected a string, number or boolean",
        'QUEUE_LEASE: "120" has no unit; write e.g. 120s, 2m or 1h',
    ]


def test_toml_same_key_in_both_spellings_is_a_problem(tmp_path: Path) -> None:
    toml = write(tmp_path / "b.toml", 'lease = "1m"\nQUEUE_LEASE = "2m"\n')
    assert problems(toml_file=toml) == [
        f"QUEUE_LEASE: set twice in TOML file {toml} (QUEUE_LEASE and lease); keep one"
    ]


def test_invalid_toml_is_a_problem(tmp_path: Path) -> None:
    toml = write(tmp_path / "b.toml", "lease = \n")
    (line,) = problems(toml_file=toml)
    assert line.startswith(f"{toml}: cannot read TOML")


# --- validation --------------------------------------------------------------


def test_bare_number_duration_rejected() -> None:
    assert problems({"QUEUE_LEASE": "120"}) == [
        'QUEUE_LEASE: "120" has no unit; write e.g. 120s, 2m or 1h'
    ]


def test_every_problem_reported_at_once_one_per_line() -> None:
    env = {
        "QUEUE_WORKERS": "0",
        "QUEUE_LEASE": "120",
        "QUEUE_POLL_INTERVAL": "0s",
        "QUEUE_MAX_ATTEMPTS": "many",
        "QUEUE_RETENTION_TTL": "-1h",
        "QUEUE_MAX_MEMORY_PER_WORKER": "512",
        "QUEUE_MAX_PAYLOAD_BYTES": "0",
        "QUEUE_NOTIFY": "maybe",
        "HTTP_ADDR": "localhost:70000",
        "LOG_FORMAT": "xml",
    }
    assert problems(env) == [
        "QUEUE_WORKERS: must be at least 1 (got 0); write e.g. 2",
        'QUEUE_POLL_INTERVAL: must be greater than 0 (got "0s"); write e.g. 1s',
        'QUEUE_LEASE: "120" has no unit; write e.g. 120s, 2m or 1h',
        'QUEUE_MAX_MEMORY_PER_WORKER: "512" has no unit; write e.g. 512MiB or 512MB',
        'QUEUE_MAX_ATTEMPTS: "many" is not a whole number; write e.g. 5',
        'QUEUE_RETENTION_TTL: must not be negative (got "-1h"); '
        "write e.g. 720h, or 0 to disable retention",
        "QUEUE_MAX_PAYLOAD_BYTES: must be greater than 0; write e.g. 1MiB",
        'QUEUE_NOTIFY: "maybe" is not a boolean; write true or false',
        'HTTP_ADDR: "localhost:70000" is not host:port; write e.g. 127.0.0.1:8090 or [::1]:8090',
        'LOG_FORMAT: "xml" is not allowed; write one of kv, json',
    ]


@pytest.mark.parametrize(
    ("key", "text"),
    [("QUEUE_RETENTION_TTL", "0"), ("QUEUE_RETENTION_PERIOD", "0"),
     ("QUEUE_MAX_MEMORY_PER_WORKER", "0"), ("QUEUE_MAX_JOBS_PER_WORKER", "0")],
)  # fmt: skip
def test_zero_allowed_where_it_has_a_meaning(key: str, text: str) -> None:
    assert load({key: text}).sources[key] in ("env", "computed")


@pytest.mark.parametrize(
    "key", ["QUEUE_LEASE", "QUEUE_REAPER_PERIOD", "QUEUE_WATCHDOG_GRACE", "QUEUE_BACKOFF_BASE"]
)
def test_zero_rejected_for_periods(key: str) -> None:
    (line,) = problems({key: "0"})
    assert line.startswith(f'{key}: must be greater than 0 (got "0")')


def test_retention_ttl_zero_means_disabled_and_is_kept() -> None:
    assert load({"QUEUE_RETENTION_TTL": "0"}).retention_ttl == timedelta(0)


def test_cross_checks() -> None:
    env = {"QUEUE_ATTEMPT_TIMEOUT": "10m", "QUEUE_BACKOFF_BASE": "2m"}
    assert problems(env) == [
        "QUEUE_ATTEMPT_TIMEOUT: 10m is longer than QUEUE_MAX_EXECUTION_TIMEOUT (5m); "
        "write at most 5m or raise QUEUE_MAX_EXECUTION_TIMEOUT",
        "QUEUE_BACKOFF_BASE: 2m is longer than QUEUE_BACKOFF_MAX (1m); "
        "write at most 1m or raise QUEUE_BACKOFF_MAX",
    ]
    load({"QUEUE_ATTEMPT_TIMEOUT": "5m", "QUEUE_BACKOFF_BASE": "1m"})  # equal is fine


DURATION_KEYS = [
    "QUEUE_POLL_INTERVAL",
    "QUEUE_LEASE",
    "QUEUE_ATTEMPT_TIMEOUT",
    "QUEUE_MAX_EXECUTION_TIMEOUT",
    "QUEUE_BACKOFF_BASE",
    "QUEUE_BACKOFF_MAX",
    "QUEUE_REAPER_PERIOD",
    "QUEUE_RETENTION_TTL",
    "QUEUE_RETENTION_PERIOD",
    "QUEUE_WATCHDOG_GRACE",
    "QUEUE_GRACEFUL_TIMEOUT",
    "QUEUE_WORKER_CONNECTION_IDLE",
]


@pytest.mark.parametrize("key", DURATION_KEYS)
def test_a_duration_past_365_days_is_refused_at_start(key: str) -> None:
    """``999999999d`` used to load, then the settle failed with DatetimeFieldOverflow."""
    (line,) = [p for p in problems({key: "999999999d"}) if p.startswith(f"{key}:")]
    assert line.startswith(f'{key}: "999999999d" is longer than 8760h (365 days)'), line
    # The bound itself is fine (with the limits that cross checks compare it with).
    upper = {"QUEUE_MAX_EXECUTION_TIMEOUT": "8760h", "QUEUE_BACKOFF_MAX": "8760h"}
    assert load({**upper, key: "8760h"}).sources[key] == "env"


def test_out_of_bound_durations_are_listed_with_every_other_problem_at_once(tmp_path: Path) -> None:
    toml = write(tmp_path / "brooq.toml", 'lease = "400d"\n')
    env = {
        "QUEUE_BACKOFF_MAX": "999999999d",
        "QUEUE_RETENTION_TTL": "99999999999d",
        "QUEUE_WORKERS": "0",
    }
    assert problems(env, toml_file=toml) == [
        "QUEUE_WORKERS: must be at least 1 (got 0); write e.g. 2",
        'QUEUE_LEASE: "400d" is longer than 8760h (365 days); write e.g. 2m',
        'QUEUE_BACKOFF_MAX: "999999999d" is longer than 8760h (365 days); write e.g. 1m',
        'QUEUE_RETENTION_TTL: "99999999999d" is too long; write at most 8760h (365 days)',
    ]


def test_values_are_normalised() -> None:
    s = load({"QUEUE_NOTIFY": "Off", "LOG_LEVEL": "WARNING", "HTTP_ADDR": "[::1]:9000"})
    assert s.notify is False and s.log_level == "warning" and s.http_addr == "[::1]:9000"


# --- computed settings -------------------------------------------------------


def test_computed_reaper_period_watchdog_grace_retention_period() -> None:
    s = load({"QUEUE_LEASE": "2m"})
    assert s.reaper_period == timedelta(seconds=30)
    assert s.watchdog_grace == timedelta(minutes=2)
    assert s.retention_period == timedelta(minutes=5)
    assert s.sources["QUEUE_REAPER_PERIOD"] == "computed"
    assert load({"QUEUE_LEASE": "10s"}).reaper_period == timedelta(seconds=5)


def test_explicit_values_beat_computed_ones() -> None:
    env = {
        "QUEUE_REAPER_PERIOD": "7s",
        "QUEUE_WATCHDOG_GRACE": "9s",
        "QUEUE_RETENTION_PERIOD": "1h",
    }
    s = load(env)
    assert (s.reaper_period, s.watchdog_grace) == (timedelta(seconds=7), timedelta(seconds=9))
    assert s.retention_period == timedelta(hours=1)
    assert s.sources["QUEUE_REAPER_PERIOD"] == "env"


def test_kind_defaults() -> None:
    s = load({"QUEUE_MAX_ATTEMPTS": "3", "QUEUE_ATTEMPT_TIMEOUT": "30s"})
    assert s.kind_defaults() == {
        "max_attempts": 3,
        "attempt_timeout": timedelta(seconds=30),
        "max_execution_timeout": timedelta(minutes=5),
        "backoff_base": timedelta(seconds=1),
        "backoff_max": timedelta(minutes=1),
    }


# --- secrets -----------------------------------------------------------------


def test_bad_dsn_is_hidden_in_errors() -> None:
    (line,) = problems({"DATABASE_URL": f"mysql://app:{SECRET}@db/app"})
    assert line.startswith("DATABASE_URL: not a postgres URL (value hidden)")
    assert SECRET not in line


@pytest.mark.parametrize(
    "dsn", [DSN, f"postgres://app:{SECRET}@h/db", f"host=h dbname=app password={SECRET}"]
)
def test_valid_dsn_forms(dsn: str) -> None:
    assert load({"DATABASE_URL": dsn}).database_url == dsn


def test_secrets_never_in_repr_env_or_toml_output() -> None:
    s = load({"DATABASE_URL": DSN, "BROOQ_TOKEN": TOKEN})
    for text in (
        repr(s),
        settings_to_env(s),
        settings_to_toml(s),
        redact_dsn(s.database_url or ""),
    ):
        assert SECRET not in text and TOKEN not in text
    assert "DATABASE_URL=postgresql://app:***@db.internal:5432/app\n" in settings_to_env(s)
    assert "BROOQ_TOKEN=***\n" in settings_to_env(s)
    assert 'brooq_token = "***"' in settings_to_toml(s)


def test_unset_secrets_shown_empty_in_env_and_omitted_in_toml() -> None:
    s = load()
    assert "DATABASE_URL=\n" in settings_to_env(s) and "BROOQ_TOKEN=\n" in settings_to_env(s)
    assert "database_url" not in settings_to_toml(s) and "brooq_token" not in settings_to_toml(s)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        (DSN, "postgresql://app:***@db.internal:5432/app"),
        (f"postgresql://app:p@ss{SECRET}@h/db", "postgresql://app:***@h/db"),
        (f"postgresql://h/db?sslmode=require&password={SECRET}", "postgresql://h/db?sslmode=require&password=***"),
        ("postgresql://app@h/db", "postgresql://app@h/db"),
        (f"host=h password={SECRET} dbname=app", "host=h password=*** dbname=app"),
        (f"host=h password = '{SECRET} x\\'y' dbname=app", "host=h password = *** dbname=app"),
    ],
)  # fmt: skip
def test_redact_dsn(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown


def test_credentials_directory(tmp_path: Path) -> None:
    write(tmp_path / "database-url", DSN + "\n")
    write(tmp_path / "brooq-token", TOKEN + "\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "DATABASE_URL": "postgresql://other/db"}
    s = load(env)
    assert s.database_url == DSN and s.token == TOKEN
    assert s.sources["DATABASE_URL"] == "credentials"
    assert load(env, overrides={"DATABASE_URL": "postgresql://cli/db"}).database_url == (
        "postgresql://cli/db"
    )


def test_an_empty_token_credential_sets_no_token_and_lets_the_environment_show(
    tmp_path: Path,
) -> None:
    """What docs/operations.md and systemd/brooq.service say of an empty brooq-token."""
    write(tmp_path / "database-url", DSN)
    write(tmp_path / "brooq-token", "")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert load(env).token is None  # the job endpoints are off
    assert load({**env, "BROOQ_TOKEN": TOKEN}).token == TOKEN  # an empty value is unset


def test_credentials_directory_without_the_files(tmp_path: Path) -> None:
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "DATABASE_URL": DSN}
    assert load(env).database_url == DSN and load(env).token is None


# --- warnings ----------------------------------------------------------------


def test_unknown_queue_key_warns_with_suggestion(tmp_path: Path) -> None:
    dotenv = write(tmp_path / "b.env", "QUEUE_WORKRES=3\nOTHER_APP_SETTING=1\n")
    toml = write(tmp_path / "b.toml", 'leese = "1m"\n')
    s = load({"QUEUE_LEAS": "1m", "PATH": "/bin"}, env_file=dotenv, toml_file=toml)
    assert s.warnings == (
        f"leese: unknown setting in TOML file {toml}; did you mean lease?",
        f"QUEUE_WORKRES: unknown setting in {dotenv}; did you mean QUEUE_WORKERS?",
        "QUEUE_LEAS: unknown setting in env; did you mean QUEUE_LEASE?",
    )
    assert s.lease == timedelta(minutes=2)  # unknown keys are ignored
    assert load({"QUEUE_ZZZZZZZZZ": "1"}).warnings == (
        "QUEUE_ZZZZZZZZZ: unknown setting in env; ignored",
    )


def test_warnings_travel_with_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load({"QUEUE_LEAS": "1m", "QUEUE_WORKERS": "0"})
    assert caught.value.warnings == (
        "QUEUE_LEAS: unknown setting in env; did you mean QUEUE_LEASE?",
    )


def test_warnings_and_sources_do_not_affect_equality() -> None:
    assert load({"QUEUE_LEAS": "1m"}) == load({"QUEUE_WORKERS": "2"})


# --- show: env and TOML output -----------------------------------------------


def test_settings_to_env_reads_back_the_same(tmp_path: Path) -> None:
    s = load({"QUEUE_WORKERS": "4", "QUEUE_RETENTION_TTL": "0", "QUEUE_NOTIFY": "no",
              "QUEUE_MAX_MEMORY_PER_WORKER": "1GiB",
              "DATABASE_URL": "host=db dbname=app"})  # fmt: skip
    dotenv = write(tmp_path / "shown.env", settings_to_env(s))
    assert load(env_file=dotenv) == s


def test_settings_to_toml_reads_back_the_same(tmp_path: Path) -> None:
    s = load({"QUEUE_WORKERS": "4", "QUEUE_LEASE": "1h30m", "QUEUE_NOTIFY": "off"})
    toml = write(tmp_path / "shown.toml", settings_to_toml(s))
    assert "workers = 4\n" in toml.read_text() and 'lease = "1h30m"\n' in toml.read_text()
    assert load(toml_file=toml) == s


# --- value syntax ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "td"),
    [
        ("120s", timedelta(seconds=120)),
        ("2m", timedelta(minutes=2)),
        ("720h", timedelta(hours=720)),
        ("500ms", timedelta(milliseconds=500)),
        ("1h30m", timedelta(minutes=90)),
        ("1.5s", timedelta(milliseconds=1500)),
        ("2d", timedelta(days=2)),
        ("0", timedelta(0)),
        ("-1h", timedelta(hours=-1)),
    ],
)
def test_parse_duration(text: str, td: timedelta) -> None:
    assert parse_duration(text) == td


@pytest.mark.parametrize(
    "text", ["120", "1.5", "-5", "", "2 m", "2M", "1h 30m", "1e3s", "s", "--1s"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"no unit|not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", [" 5s", "5s ", " 3s ", "\t5s", "5s\n", "\u00a05s"])
def test_a_duration_with_spaces_around_it_is_refused(text: str) -> None:
    """Issue 32, item 13: ``attempt_timeout=" 5s"`` was accepted (the text was stripped)."""
    with pytest.raises(ValueError, match="has spaces around it; write it without"):
        parse_duration(text)
    with pytest.raises(InvalidKindOptions, match=r"attempt_timeout: .*has spaces around it"):
        KindOptions(attempt_timeout=text)


@pytest.mark.parametrize("text", ["\u0665s", "\uff15s", "1\u0660m", "\u00b2s"])
def test_a_duration_in_digits_of_another_script_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="ASCII digits"):
        parse_duration(text)


def test_a_setting_s_value_is_read_without_the_spaces_of_its_file() -> None:
    # The environment and .env files pad values by accident; every setting is stripped there.
    assert load({"QUEUE_LEASE": " 3s "}).lease == timedelta(seconds=3)


def test_parse_duration_too_long() -> None:
    with pytest.raises(ValueError, match="too long"):
        parse_duration("9999999999d")


@pytest.mark.parametrize(
    ("td", "text"),
    [
        (timedelta(minutes=2), "2m"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(days=30), "720h"),
        (timedelta(0), "0s"),
        (timedelta(microseconds=1500), "1.5ms"),
        (timedelta(seconds=-61), "-1m1s"),
    ],
)
def test_format_duration(td: timedelta, text: str) -> None:
    assert format_duration(td) == text


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_format_parse_duration_round_trip(ms: int) -> None:
    td = timedelta(milliseconds=ms)
    assert parse_duration(format_duration(td)) == td


@pytest.mark.parametrize(
    ("text", "n"),
    [("512MiB", 512 * 2**20), ("1GiB", 2**30), ("200MB", 200_000_000), ("0", 0),
     ("64kb", 64_000), ("1.5KiB", 1536), ("100B", 100)],
)  # fmt: skip
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["512", "-1MiB", "1XB", "MiB", "", "0.4B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"no unit|not a size|not a whole number"):
        parse_size(text)


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (2**20, "1MiB"), (200_000_000, "200MB"), (1023, "1023B"), (1024, "1KiB")],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


@given(st.integers(min_value=0, max_value=2**50))
def test_format_parse_size_round_trip(n: int) -> None:
    assert parse_size(format_size(n)) == n


@pytest.mark.parametrize(
    ("text", "parsed"), [("127.0.0.1:8090", ("127.0.0.1", 8090)), ("[::1]:1", ("::1", 1))]
)
def test_parse_addr(text: str, parsed: tuple[str, int]) -> None:
    assert parse_addr(text) == parsed


@pytest.mark.parametrize("text", [":8090", "host", "host:65536", "::1:80", "h:8o"])
def test_parse_addr_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not host:port"):
        parse_addr(text)


@pytest.mark.parametrize(
    ("value", "td"),
    [(timedelta(seconds=3), timedelta(seconds=3)), (30, timedelta(seconds=30)),
     (1.5, timedelta(milliseconds=1500)), ("2m", timedelta(minutes=2)), (0, timedelta(0))],
)  # fmt: skip
def test_coerce_duration(value: timedelta | int | float | str, td: timedelta) -> None:
    assert coerce_duration(value, name="attempt_timeout") == td


@pytest.mark.parametrize("value", [True, -1, "30", "-5s", timedelta(seconds=-1), float("nan"), [1]])
def test_coerce_duration_rejects_naming_the_option(value: object) -> None:
    with pytest.raises(ValueError, match=r"^attempt_timeout: "):
        coerce_duration(value, name="attempt_timeout")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("hunter2-s3cret", "14 bytes is too short for a secret: use at least 32 bytes"),
        ("é" * 15, "30 bytes is too short"),  # bytes, not characters
        ("x" * 64, "one character repeated is no secret"),
    ],
)
def test_a_weak_token_is_refused_for_every_command(token: str, why: str) -> None:
    # Issue 22, item 8: 32 bytes on loopback too, not only with HTTP_ALLOW_REMOTE.
    (line,) = problems({"BROOQ_TOKEN": token})
    assert line.startswith("BROOQ_TOKEN: " + why) and "openssl rand -hex 32" in line
    assert token not in line
    assert load({"BROOQ_TOKEN": TOKEN}).token == TOKEN


@pytest.mark.parametrize(
    ("key", "text", "why"),
    [
        ("QUEUE_LEASE", "1ms", '"1ms" is shorter than 1s: a lease runs out before its heartbeat'),
        ("QUEUE_LEASE", "999ms", '"999ms" is shorter than 1s'),
        ("QUEUE_REAPER_PERIOD", "1ms", '"1ms" is shorter than 1s: every supervisor would run'),
        (
            "QUEUE_MAX_PAYLOAD_BYTES",
            "100TiB",
            '"100TiB" is larger than 16MiB, the most a job can carry to its worker',
        ),
        ("QUEUE_MAX_PAYLOAD_BYTES", "17MiB", '"17MiB" is larger than 16MiB'),
    ],
)
def test_settings_that_cannot_work_are_refused_with_their_bound(
    key: str, text: str, why: str
) -> None:
    # Issue 22, item 18: each was accepted, and --lease 1ms claimed one job twice.
    (line,) = problems({key: text})
    assert line.startswith(f"{key}: {why}") and "write e.g." in line
    (flag,) = problems(overrides={key: text})  # --lease 1ms: the same check
    assert flag == line


def test_the_bounds_themselves_are_accepted() -> None:
    s = load({"QUEUE_LEASE": "1s", "QUEUE_REAPER_PERIOD": "1s", "QUEUE_MAX_PAYLOAD_BYTES": "16MiB"})
    assert (s.lease, s.reaper_period) == (timedelta(seconds=1), timedelta(seconds=1))
    assert s.max_payload_bytes == 16 * 1024 * 1024


def test_a_kind_refuses_attempts_the_setting_refuses() -> None:
    with pytest.raises(InvalidKindOptions, match=r"max_attempts: must be at most 1,000,000"):
        KindOptions(max_attempts=10**12)
    with pytest.raises(InvalidKindOptions, match=r"max_running: must be at most 2,147,483,647"):
        KindOptions(max_running=2**31)
    assert KindOptions(max_attempts=1_000_000).max_attempts == 1_000_000
    assert problems({"QUEUE_MAX_ATTEMPTS": "1000001"})[0].startswith(
        "QUEUE_MAX_ATTEMPTS: must be at most 1000000"
    )


def test_poll_interval_and_retention_below_their_bounds_are_refused_all_at_once() -> None:
    """Issue 32, item 9: QUEUE_POLL_INTERVAL=1ms made an idle supervisor commit ~700 times a
    second, and QUEUE_RETENTION_TTL=1ms deleted outcomes before anyone could read them."""
    env = {
        "QUEUE_POLL_INTERVAL": "1ms",
        "QUEUE_RETENTION_TTL": "1ms",
        "QUEUE_RETENTION_PERIOD": "1ms",
    }
    assert [line.split(";")[0] for line in problems(env)] == [
        'QUEUE_POLL_INTERVAL: "1ms" is shorter than 50ms: every idle supervisor would query '
        "the database that often",
        'QUEUE_RETENTION_TTL: "1ms" is shorter than 1m: results, idempotency keys and '
        "finished parents would be deleted before anyone could read them",
        'QUEUE_RETENTION_PERIOD: "1ms" is shorter than 1s: every supervisor would run '
        "retention's DELETE that often",
    ]
    assert "write e.g. 1s" in problems({"QUEUE_POLL_INTERVAL": "49ms"})[0]
    (flag,) = problems(overrides={"QUEUE_POLL_INTERVAL": "10ms"})  # --poll-interval 10ms
    assert flag.startswith('QUEUE_POLL_INTERVAL: "10ms" is shorter than 50ms')


def test_poll_interval_and_retention_bounds_themselves_are_accepted() -> None:
    s = load({"QUEUE_POLL_INTERVAL": "50ms", "QUEUE_RETENTION_TTL": "1m",
              "QUEUE_RETENTION_PERIOD": "1s"})  # fmt: skip
    assert (s.poll_interval, s.retention_ttl, s.retention_period) == (
        timedelta(milliseconds=50),
        timedelta(minutes=1),
        timedelta(seconds=1),
    )
    assert load({"QUEUE_RETENTION_TTL": "0"}).retention_ttl == timedelta(0)  # still "off"
