"""brooq settings: one validated, immutable `Settings` built from every source.

The table of every setting is `brooq.config.settings.Settings`; the value
syntax is in `values`, the sources in `sources`, the text forms in `output`.
Secrets (the DSN password, the bearer token) never appear in errors,
warnings, ``repr`` or ``config show`` output.
"""

from brooq.config.output import env_example, settings_to_env, settings_to_toml
from brooq.config.settings import BY_ENV, KEYS, Key, LogFormat, LogLevel, Settings
from brooq.config.sources import CREDENTIAL_FILES, load_settings
from brooq.config.values import ConfigError, format_size, parse_addr, parse_size
from brooq.postgres.dsn import redact_dsn
from brooq.vocabulary.durations import coerce_duration, format_duration, parse_duration

__all__ = [
    "BY_ENV",
    "CREDENTIAL_FILES",
    "KEYS",
    "ConfigError",
    "Key",
    "LogFormat",
    "LogLevel",
    "Settings",
    "coerce_duration",
    "env_example",
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
