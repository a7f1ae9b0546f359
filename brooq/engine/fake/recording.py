"""The connection a settle hook gets from the in-memory store: it records, it runs nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Executed:
    """One statement a settle hook ran on the fake's connection."""

    sql: str
    params: Any = None


@dataclass
class FakeCursor:
    """What ``RecordingConnection.execute`` returns: no rows, like a write."""

    rowcount: int = 0

    def fetchone(self) -> None:
        """No row: the fake runs no SQL."""
        return None

    def fetchall(self) -> list[Any]:
        """No rows: the fake runs no SQL."""
        return []


@dataclass
class RecordingConnection:
    """What a settle hook receives from the in-memory store in place of a connection.

    ``execute(sql, params)`` records the statement (it runs nothing); what a
    settle's hooks recorded reaches ``store.executed`` only if the settle
    commits, so a failing hook leaves nothing behind, as a rolled-back
    transaction would.
    """

    executed: list[Executed] = field(default_factory=list)

    def execute(self, sql: str, params: Any = None) -> FakeCursor:
        """Record ``sql`` with ``params``."""
        self.executed.append(Executed(sql, params))
        return FakeCursor()
