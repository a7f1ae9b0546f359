"""What one setting is: a `Key` (environment name, kind, default, help, section, flags).

A key is declared once, as a class attribute of a group of settings (see the
other modules of this package); as an attribute of a `Settings` instance it
reads that instance's value: ``settings.lease``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, overload

from brooq.config import values as v
from brooq.postgres.dsn import REDACTED, redact_dsn

T = TypeVar("T")

WORK = "work"
SUPERVISE = "supervise"
DASHBOARD = "dashboard"
GLOBAL = "global"
"""A flag of the top-level parser (``brooq --log-format json …``)."""


class KeyTable:
    """A class whose `Key` attributes read the values of its instances (`Settings` is one)."""

    _values: dict[str, Any]


class Key(Generic[T]):
    """One setting. As a class attribute of a `KeyTable` it reads the value of an instance."""

    def __init__(
        self,
        env: str,
        kind: v.Kind[Any],
        default: str | None,
        help: str,
        *,
        section: str,
        example: str = "",
        secret: bool = False,
        commands: tuple[str, ...] = (),
        computed: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> None:
        self.env, self.kind, self.default, self.help = env, kind, default, help
        self.section, self.example, self.secret = section, example, secret
        # Secrets never become flags: a command line is visible to every local user (ps).
        self.commands = () if secret else commands
        self.computed = computed
        self.attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name

    @overload
    def __get__(self, obj: None, owner: type) -> Key[T]: ...

    @overload
    def __get__(self, obj: KeyTable, owner: type) -> T: ...

    def __get__(self, obj: KeyTable | None, owner: type) -> Key[T] | T:
        if obj is None:
            return self
        value: T = obj._values[self.attr]
        return value

    @property
    def toml(self) -> str:
        """The key's TOML spelling: lowercase, without the QUEUE_ prefix."""
        return self.env.lower().removeprefix("queue_")

    @property
    def flag(self) -> str:
        """The command-line flag: ``--`` and the attribute with dashes."""
        return "--" + self.attr.replace("_", "-")

    def parse(self, text: str) -> Any:
        """The value of ``text``; ValueError saying what to write instead."""
        return self.kind.parse(text, self.example or self.default or "")

    def shown(self, value: Any) -> str | None:
        """The value as ``config show`` prints it: secrets redacted, None when unset."""
        if value is None:
            return None
        if self.secret:
            return redact_dsn(value) if self.kind is v.DSN else REDACTED
        return self.kind.show(value)


def keys_of(*groups: type) -> tuple[Key[Any], ...]:
    """The keys declared by ``groups``, group by group, each in declaration order."""
    return tuple(k for group in groups for k in vars(group).values() if isinstance(k, Key))
