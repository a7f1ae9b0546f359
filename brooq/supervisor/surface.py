"""The supervisor's service surface: /healthz, /metrics and the dashboard at /ui.

The HTTP server runs in threads of its own (brooq.surface); the loop only
publishes a health verdict each tick and a snapshot of what its workers do.
Health is judged from the supervisor's own state (workers up and not
wedged, the database thread answering), never by a query in an HTTP thread,
and never carries database error text.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from brooq import metrics as prom
from brooq.surface.dashboard import Dashboard
from brooq.surface.dashboard.pool import PortPool
from brooq.surface.dashboard.ports import close_ports, postgres_ports
from brooq.surface.service import HealthBoard, ServiceSurface

if TYPE_CHECKING:
    from brooq.supervisor.arbiter import Supervisor

DATABASE_SILENT_S = 10.0
"""/healthz fails when the database thread has not finished a task for this long."""


class Surface:
    """The HTTP surface of one supervisor, and the health board its loop keeps current."""

    def __init__(self, service: ServiceSurface, board: HealthBoard) -> None:
        self.service, self.board = service, board
        self.address = service.address
        self.ports: PortPool | None = None

    @classmethod
    def open(cls, sup: Supervisor) -> Surface | None:
        """Bind HTTP_ADDR (SurfaceConfigError before any worker is forked); None when off."""
        settings = sup.settings
        if not settings.http_addr:
            return None
        board = HealthBoard()
        topics = sup.queue.registry.topics()
        ports = postgres_ports(sup.dsn)  # the dashboard's own connections, never the loop's
        service = ServiceSurface(
            settings.http_addr,
            dsn=sup.dsn,
            topics=topics,
            supervisor_pid=sup.pid,
            health=board,
            token=settings.token,
            allow_remote=settings.http_allow_remote,
            allowed_hosts=settings.http_allowed_hosts or (),
            collectors=[prom.WorkersCollector(lambda: workers_snapshot(sup), topics)],
            more_routes=Dashboard(ports, settings.token, remote=settings.http_allow_remote).routes,
        )
        surface = cls(service, board)
        surface.ports = ports
        return surface

    def start(self) -> None:
        """Serve in the server's threads."""
        self.service.start()

    def publish(self, sup: Supervisor) -> None:
        """The loop's verdict for /healthz, once per tick."""
        self.board.publish(*health(sup))

    def asked_since(self, since: float) -> bool:
        """True when /healthz was read after ``since``: worth a fresh look at the database."""
        return self.board.asked_since(since)

    def close(self) -> None:
        """Stop serving (within about a second, slow clients or not)."""
        self.service.close()
        if self.ports is not None:
            close_ports(self.ports)


def workers_snapshot(sup: Supervisor) -> tuple[int, dict[str, int]]:
    """Worker processes running, and busy workers per topic (read from an HTTP thread)."""
    busy: dict[str, int] = {}
    for child in list(sup.children.values()):
        job = child.job
        if job is not None:
            busy[job.claimed.topic] = busy.get(job.claimed.topic, 0) + 1
    return len(sup.children), busy


def health(sup: Supervisor) -> tuple[bool, str]:
    """/healthz: workers up and not wedged, the database answering; a fixed reason."""
    if sup.stopping:
        return False, f"stopping ({sup.stopping})"
    if not sup.db.answering(time.monotonic(), DATABASE_SILENT_S):
        return False, "database unavailable"
    running = sum(
        1
        for c in sup.children.values()
        if c.booted and not c.retiring and c.kill is None and not c.closed
    )
    if running < len(sup.slots):
        return False, f"{running} of {len(sup.slots)} workers running"
    return True, f"{running} workers running"
