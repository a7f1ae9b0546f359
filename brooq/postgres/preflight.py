"""Checks a command makes before it starts: is the schema this brooq's, is there room to connect.

Every command that touches the job table (``work`` and ``supervise`` included)
calls :func:`check_schema` first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from brooq.postgres.behind import GRANTS_DOC
from brooq.postgres.connect import Connector, Source
from brooq.postgres.migrations import migration_ids
from brooq.postgres.schema import YOYO_READABLE, compare, mismatch_message
from brooq.postgres.sql import sql
from brooq.vocabulary import PrivilegeMissing, SchemaBehind, SchemaMismatch, SchemaMissing

CHECK_TIMEOUT = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class ConnectionRoom:
    """The server's connection budget as a non-superuser sees it."""

    max_connections: int
    reserved: int
    in_use: int

    @property
    def free(self) -> int:
        """Client connections the server would still accept."""
        return max(0, self.max_connections - self.reserved - self.in_use)


def check_schema(dsn: str) -> None:
    """Refuse a database whose migrations are not exactly this brooq's.

    SchemaMissing without the job table, SchemaBehind (a SchemaMismatch) when
    migrations are missing, SchemaMismatch when ``brooq migrate`` recorded ones
    this brooq does not ship (ahead); StoreUnavailable when the database is down. On the way, a
    transaction-pooling PgBouncer is detected (it refuses the statement
    timeout's startup option) and this process switches to its profile.
    """
    connector = Connector(Source(dsn, statement_timeout=CHECK_TIMEOUT))
    try:
        with connector.connection() as conn:
            facts = {str(r[0]) for r in conn.execute(sql("schema_facts"))}
            recorded = (
                [str(r[0]) for r in conn.execute(sql("yoyo_applied_ids"))]
                if YOYO_READABLE in facts
                else []
            )
    finally:
        connector.close()
    if "relation:job" not in facts:
        raise SchemaMissing("job")
    state = compare(migration_ids(), facts, recorded)
    if state.missing:
        raise SchemaBehind(mismatch_message(state))
    if not state.matches:
        raise SchemaMismatch(mismatch_message(state))


def check_privileges(dsn: str) -> None:
    """PrivilegeMissing naming brooq's tables this role may not read and write.

    What ``supervise`` and ``work`` check before they start; a command that
    only reads finds out at its first statement instead (the same error).
    """
    lacking = [str(r[0]) for r in _rows(dsn, "tables_without_dml")]
    if lacking:
        raise PrivilegeMissing(
            f"the database role lacks SELECT, INSERT, UPDATE, DELETE on {', '.join(lacking)}: "
            f"give it the grants of {GRANTS_DOC}"
        )


def jit_left_on(dsn: str) -> bool:
    """True when brooq's own connections to ``dsn`` still JIT-compile their statements:
    through PgBouncer, which refuses the startup option (``jit=off``) that turns it off
    everywhere else, unless the role or the database has ``jit = off``."""
    return any(row[0] for row in _rows(dsn, "jit_on"))


def connection_room(dsn: str) -> ConnectionRoom:
    """How many connections the server allows and has in use now."""
    (row,) = _rows(dsn, "connection_room")
    return ConnectionRoom(int(row[0]), int(row[1]), int(row[2]))


def _rows(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    """The rows of the named statement, on a connection of its own."""
    connector = Connector(dsn)
    try:
        with connector.connection() as conn:
            return conn.execute(sql(statement)).fetchall()
    finally:
        connector.close()
