"""The Inspection port over PostgreSQL: operators' reads, each under a statement time limit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from brooq.engine.inspection import DeadJob, RunningJob, TopicStateCount
from brooq.postgres.connect import Connector, Source
from brooq.postgres.sql import sql

READ_TIMEOUT = timedelta(seconds=5)


class PostgresInspection:
    """Read-only views of the ``job`` table, on a connection of their own.

    Each read runs in a short transaction whose statements PostgreSQL stops
    after ``timeout``: a cold scrape of a huge table answers late or not at
    all, but never holds its caller (a supervisor's HTTP thread) for long.
    """

    def __init__(self, source: str | ConnectionPool | psycopg.Connection[Any] | Connector,
                 timeout: timedelta = READ_TIMEOUT, prepare: bool = True) -> None:
        self.connector = (source if isinstance(source, Connector)
                          else Connector(Source(source, prepare=prepare)))
        self.timeout = timeout

    @contextmanager
    def _reading(self) -> Iterator[psycopg.Cursor[dict[str, Any]]]:
        ms = f"{max(1, int(self.timeout.total_seconds() * 1000))}ms"
        with self.connector.connection() as conn, conn.transaction():
            conn.execute(sql("limit_statement_time"), {"timeout": ms})
            yield conn.cursor(row_factory=dict_row)

    def depth(self) -> list[TopicStateCount]:
        """Rows per topic and state."""
        with self._reading() as cur:
            return [TopicStateCount(**row) for row in cur.execute(sql("depth"))]

    def oldest_ready(self) -> dict[str, float]:
        """Seconds the oldest ready job of each topic has waited; topics with none are absent."""
        with self._reading() as cur:
            rows = cur.execute(sql("oldest_ready"))
            return {r["topic"]: float(r["oldest_ready_s"]) for r in rows}

    def running(self) -> list[RunningJob]:
        """Jobs in flight with holder and seconds of lease left."""
        with self._reading() as cur:
            return [RunningJob(**{**row, "id": str(row["id"]),
                                  "lease_left_s": _seconds(row["lease_left_s"])})
                    for row in cur.execute(sql("running"))]

    def recent_dead(self, since: timedelta, limit: int = 20) -> list[DeadJob]:
        """Jobs that went dead within ``since``, newest first."""
        with self._reading() as cur:
            rows = cur.execute(sql("recent_dead"), {"since": since, "limit": limit})
            return [DeadJob(**{**row, "id": str(row["id"])}) for row in rows]

    def count_dead(self, since: timedelta) -> int:
        """How many jobs went dead within ``since``."""
        with self._reading() as cur:
            row = cur.execute(sql("count_dead"), {"since": since}).fetchone()
        return int(row["dead"]) if row else 0

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers."""
        with self.connector.connection() as conn:
            conn.execute(sql("ping"))

    def close(self) -> None:
        """Close the connection this inspection opened."""
        self.connector.close()


def _seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)
