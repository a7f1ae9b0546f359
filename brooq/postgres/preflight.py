"""Checks a command makes before it starts: is the schema there, is there room to connect."""

from __future__ import annotations

from dataclasses import dataclass

from brooq.postgres.connect import Connector
from brooq.postgres.sql import sql
from brooq.vocabulary import SchemaMissing


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
    """SchemaMissing unless the job table exists (StoreUnavailable when the database is down)."""
    connector = Connector(dsn)
    try:
        with connector.connection() as conn:
            row = conn.execute(sql("job_table_exists")).fetchone()
    finally:
        connector.close()
    if not row or not row[0]:
        raise SchemaMissing("job")


def connection_room(dsn: str) -> ConnectionRoom:
    """How many connections the server allows and has in use now."""
    connector = Connector(dsn)
    try:
        with connector.connection() as conn:
            row = conn.execute(sql("connection_room")).fetchone()
    finally:
        connector.close()
    assert row is not None
    return ConnectionRoom(int(row[0]), int(row[1]), int(row[2]))
