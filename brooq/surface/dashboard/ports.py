"""The dashboard's ports over PostgreSQL: a few sets of connections, one page on each at a time.

See :mod:`brooq.surface.dashboard.pool` for why pages are shed rather than
queued. Statements run outside the fork gate: only opening and closing a
connection hold forks off (`brooq.postgres.connect.Source.guard`), since
those take the process-wide locks a forked child must not inherit, so a
page never delays the supervisor's forks.
"""

from __future__ import annotations

from datetime import timedelta

from brooq.osproc import no_fork
from brooq.postgres.admin import PostgresAdmin
from brooq.postgres.connect import Connector, Source
from brooq.postgres.inspection import PostgresInspection
from brooq.surface.dashboard.pages import DashboardPorts
from brooq.surface.dashboard.pool import PAGES, PageBudget, PortPool, PortSet

WRITE_TIMEOUT = timedelta(seconds=10)
"""One batch of an action (at most 1,000 rows) is stopped past this."""


def _port_set(dsn: str) -> PortSet:
    budget = PageBudget()
    inspection = PostgresInspection(Connector(Source(dsn, guard=no_fork)), timeout=budget.left)
    admin = PostgresAdmin(Connector(Source(dsn, statement_timeout=WRITE_TIMEOUT, guard=no_fork)))

    def close() -> None:
        inspection.close()
        admin.close()

    return PortSet(DashboardPorts(inspection, admin), budget.start, close)


def postgres_ports(dsn: str, pages: int = PAGES) -> PortPool:
    """``pages`` sets of Inspection and Admin, each on connections of its own (opened by the
    first page that uses them)."""
    return PortPool([_port_set(dsn) for _ in range(pages)])


def close_ports(ports: PortPool) -> None:
    """Close the connections of ports made by :func:`postgres_ports`."""
    ports.close()
