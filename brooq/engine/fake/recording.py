"""The connection a settle hook gets from the in-memory store: it records, it runs nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from brooq.vocabulary import NeedsDatabase


@dataclass(frozen=True, slots=True)
class Executed:
    """One statement a settle hook ran on the fake's connection."""

    sql: str
    params: Any = None


@dataclass
class FakeCursor:
    """What ``RecordingConnection.execute`` returns: a write's cursor, with no rows to read.

    Reading it raises NeedsDatabase naming ``hook``: the fake runs no SQL, and
    ``None`` or ``[]`` would be a row PostgreSQL never returned.
    """

    rowcount: int = 0
    hook: str = "a settle hook"

    def _refuse(self) -> NeedsDatabase:
        return NeedsDatabase(
            f"{self.hook} reads what its statement returned; the in-memory store runs no "
            "SQL and has no rows to give: test this hook against PostgreSQL (brooq.Queue(dsn))"
        )

    def fetchone(self) -> Any:
        """Refused: NeedsDatabase."""
        raise self._refuse()

    def fetchall(self) -> list[Any]:
        """Refused: NeedsDatabase."""
        raise self._refuse()

    def fetchmany(self, size: int = 0) -> list[Any]:
        """Refused: NeedsDatabase."""
        raise self._refuse()

    def __iter__(self) -> Any:
        raise self._refuse()


@dataclass
class RecordingConnection:
    """What a settle hook receives from the in-memory store in place of a connection.

    ``execute(sql, params)`` records the statement (it runs nothing); what a
    settle's hooks recorded reaches ``store.executed`` only if the settle
    commits, so a failing hook leaves nothing behind, as a rolled-back
    transaction would.
    """

    executed: list[Executed] = field(default_factory=list)
    hook: str = "a settle hook"
    """The hook running now, named when it tries to read (see FakeCursor)."""

    def execute(self, sql: str, params: Any = None) -> FakeCursor:
        """Record ``sql`` with ``params``."""
        self.executed.append(Executed(sql, params))
        return FakeCursor(hook=self.hook)
