"""`Settings`: the values of every key of every group, validated and immutable."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

from brooq.config.settings.database import DatabaseKeys
from brooq.config.settings.enqueue import EnqueueKeys
from brooq.config.settings.key import Key, keys_of
from brooq.config.settings.kinds import KindKeys
from brooq.config.settings.maintenance import MaintenanceKeys
from brooq.config.settings.surface import SurfaceKeys
from brooq.config.settings.workers import WorkerKeys
from brooq.vocabulary import KindOptions
from brooq.vocabulary.durations import format_duration

GROUPS = (DatabaseKeys, WorkerKeys, KindKeys, MaintenanceKeys, EnqueueKeys, SurfaceKeys)
"""The groups of settings, in table order."""


class Settings(DatabaseKeys, WorkerKeys, KindKeys, MaintenanceKeys, EnqueueKeys, SurfaceKeys):
    """Validated, immutable settings. Durations are ``timedelta``, sizes int bytes.

    Build it with `brooq.config.load_settings()`. Zero means "unlimited" for
    ``max_jobs_per_worker`` and ``max_memory_per_worker`` and "disabled" for
    ``retention_ttl``. ``warnings`` (unknown keys) and ``sources`` (env name →
    default, toml, .env, env, credentials, cli or computed) do not take part in
    equality. ``repr()`` redacts secrets.
    """

    def __init__(
        self,
        values: Mapping[str, Any],
        warnings: tuple[str, ...] = (),
        sources: Mapping[str, str] | None = None,
    ) -> None:
        missing = {key.attr for key in KEYS} - set(values)
        if missing:
            raise TypeError(f"Settings needs a value for {', '.join(sorted(missing))}")
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "warnings", tuple(warnings))
        object.__setattr__(self, "sources", dict(sources or {}))

    warnings: tuple[str, ...]
    sources: dict[str, str]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Settings are immutable; use replace()")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self._values.items())))

    def __repr__(self) -> str:
        shown = ", ".join(f"{key.attr}={self._repr(key)}" for key in KEYS)
        return f"Settings({shown})"

    def _repr(self, key: Key[Any]) -> str:
        value = self._values[key.attr]
        return repr(key.shown(value) if key.secret else value)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (attribute names) applied; not validated again."""
        unknown = set(changes) - {key.attr for key in KEYS}
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        return Settings({**self._values, **changes}, self.warnings, self.sources)

    def items(self) -> Iterator[tuple[Key[Any], Any]]:
        """Each key with its value, in table order."""
        for key in KEYS:
            yield key, self._values[key.attr]

    def kind_options(self) -> KindOptions:
        """Defaults for every kind option that the handler's code does not set."""
        return KindOptions(**self.kind_defaults(), watchdog_grace=self.watchdog_grace)


KEYS: tuple[Key[Any], ...] = keys_of(*GROUPS)
"""Every setting, in table order (the order of `config show` and `.env.example`)."""
BY_ENV = {key.env: key for key in KEYS}
BY_ATTR = {key.attr: key for key in KEYS}
BY_NAME = {**BY_ENV, **{key.toml: key for key in KEYS}}
"""Both spellings are accepted in TOML and in overrides: QUEUE_LEASE and lease."""
ORDERED = (("attempt_timeout", "max_execution_timeout"), ("backoff_base", "backoff_max"))
"""A soft timeout above the hard one, or a base above the cap, can never take effect."""
SECTIONS = {
    "secrets": "secrets (placeholders)",
    "connections": "connections",
    "workers": "workers",
    "kinds": "defaults of every kind option that code does not set",
    "maintenance": "maintenance (run by every supervisor)",
    "enqueue": "enqueue",
    "surface": "service surface and logs",
}


def order_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(env name, problem) for each ORDERED pair whose values are the wrong way round."""
    out = []
    for low, high in ORDERED:
        small, big = values.get(low), values.get(high)
        if isinstance(small, timedelta) and isinstance(big, timedelta) and small > big:
            low_env, high_env = BY_ATTR[low].env, BY_ATTR[high].env
            out.append(
                (
                    low_env,
                    f"{format_duration(small)} is longer than {high_env} "
                    f"({format_duration(big)}); write at most {format_duration(big)} "
                    f"or raise {high_env}",
                )
            )
    return out
