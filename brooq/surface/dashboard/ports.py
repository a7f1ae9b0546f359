"""The dashboard's ports over PostgreSQL: reads with a statement timeout, bounded writes."""

from __future__ import annotations

from datetime import timedelta

from brooq.postgres.admin import PostgresAdmin
from brooq.postgres.inspection import PostgresInspection
from brooq.surface.dashboard.views import DashboardPorts

READ_TIMEOUT = timedelta(seconds=2)
"""A page's reads are stopped by PostgreSQL past this: a page answers late, never hangs."""
WRITE_TIMEOUT = timedelta(seconds=10)
"""One batch of an action (at most 1,000 rows) is stopped past this."""


def postgres_ports(dsn: str) -> DashboardPorts:
    """Inspection and Admin on connections of their own (opened at the first page)."""
    return DashboardPorts(
        PostgresInspection(dsn, timeout=READ_TIMEOUT),
        PostgresAdmin(dsn, statement_timeout=WRITE_TIMEOUT),
    )


def close_ports(ports: DashboardPorts) -> None:
    """Close the connections of ports made by :func:`postgres_ports`."""
    for port in (ports.inspection, ports.admin):
        close = getattr(port, "close", None)
        if close is not None:
            close()
