"""Where supervisors register themselves: the rows of ``brooq_supervisor`` (migration 0007)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from brooq.postgres.connect import Connector
from brooq.postgres.sql import sql


class PostgresRegistration:
    """Writes one supervisor's row; runs on the supervisor's database thread."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector

    def register(
        self,
        *,
        holder: str,
        host: str,
        pid: int,
        app: str,
        topics: Sequence[str],
        started_at: datetime,
        workers: Sequence[dict[str, Any]],
        expire_after: timedelta,
        app_version: str | None = None,
    ) -> None:
        """Upsert this supervisor's row (seen now), and delete rows of long-dead ones."""
        with self.connector.connection() as conn, conn.transaction():
            conn.execute(
                sql("register_supervisor"),
                {
                    "holder": holder,
                    "host": host,
                    "pid": pid,
                    "app": app,
                    "topics": list(topics),
                    "started_at": started_at,
                    "workers": json.dumps(list(workers), default=str),
                    "app_version": app_version,
                },
            )
            conn.execute(sql("expire_supervisors"), {"expire_after": expire_after})

    def unregister(self, holder: str) -> None:
        """Delete this supervisor's row (a clean stop)."""
        with self.connector.connection() as conn:
            conn.execute(sql("unregister_supervisor"), {"holder": holder})
