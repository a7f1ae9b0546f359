"""The dashboard's ports over PostgreSQL: reads with a statement timeout, bounded writes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from brooq.engine.admin import Admin
from brooq.engine.inspection import Inspection
from brooq.osproc import no_fork
from brooq.postgres.admin import PostgresAdmin
from brooq.postgres.inspection import PostgresInspection
from brooq.surface.dashboard.pages import DashboardPorts

READ_TIMEOUT = timedelta(seconds=2)
"""A page's reads are stopped by PostgreSQL past this: a page answers late, never hangs."""
WRITE_TIMEOUT = timedelta(seconds=10)
"""One batch of an action (at most 1,000 rows) is stopped past this."""


class HoldsOffForks:
    """Calls ``target``'s methods inside :func:`brooq.osproc.no_fork`, one call at a time.

    The dashboard runs in a supervisor's HTTP threads: while one of them is in
    libpq the loop must not fork (a child would inherit a lock held there).
    Only the database call holds forks off, never a page's rendering, so a
    busy dashboard delays a fork by one statement at most.
    """

    def __init__(self, target: object) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with no_fork():
                return attr(*args, **kwargs)

        return call


def postgres_ports(dsn: str) -> DashboardPorts:
    """Inspection and Admin on connections of their own (opened at the first page)."""
    inspection = PostgresInspection(dsn, timeout=READ_TIMEOUT)
    admin = PostgresAdmin(dsn, statement_timeout=WRITE_TIMEOUT)
    return DashboardPorts(
        cast(Inspection, HoldsOffForks(inspection)), cast(Admin, HoldsOffForks(admin))
    )


def close_ports(ports: DashboardPorts) -> None:
    """Close the connections of ports made by :func:`postgres_ports`."""
    for port in (ports.inspection, ports.admin):
        close = getattr(port, "close", None)
        if close is not None:
            close()
