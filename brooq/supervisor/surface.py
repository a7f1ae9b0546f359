"""The supervisor's service surface: what /healthz, /metrics and the job endpoints answer.

Health is judged from the supervisor's own state (workers up and turning,
the database thread answering), never by a query of its own, and never
carries database error text. Database reads for /metrics and the job
endpoints go through a connection of the surface's own, under a time limit.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from brooq import metrics as prom
from brooq.http import Endpoints, ServiceSurface
from brooq.postgres.inspection import PostgresInspection
from brooq.postgres.store import PostgresStore

if TYPE_CHECKING:
    from brooq.supervisor.arbiter import Supervisor

DATABASE_SILENT_S = 10.0
"""/healthz fails when the database thread has not finished a task for this long."""


class Surface:
    """The HTTP surface of one supervisor."""

    def __init__(self, sup: Supervisor, server: ServiceSurface) -> None:
        self.sup, self.server = sup, server
        self.address = server.address

    @classmethod
    def open(cls, sup: Supervisor) -> Surface | None:
        """Listen on HTTP_ADDR (SurfaceConfigError before any worker is forked); None when off."""
        settings = sup.settings
        if not settings.http_addr:
            return None
        store = PostgresStore(sup.dsn)
        inspection = PostgresInspection(sup.dsn)
        topics = sup.queue.registry.topics()
        collectors = [prom.DatabaseCollector(inspection, topics),
                      prom.WorkersCollector(lambda: workers_snapshot(sup), topics)]

        def cancel_job(job_id: str) -> dict[str, Any]:
            canceled = store.cancel(job_id, "canceled through the HTTP endpoint")
            return {"id": job_id, "canceled": canceled, "state": str(store.get(job_id).state)}

        endpoints = Endpoints(
            metrics=lambda: prom.render(collectors, sup.pid),
            health=lambda: health(sup),
            get_job=lambda job_id: store.get(job_id).as_dict(),
            cancel_job=cancel_job, token=settings.token,
        )
        server = ServiceSurface(settings.http_addr, endpoints, settings.http_allow_remote)
        return cls(sup, server)

    def fileno(self) -> int | None:
        """The listening socket, for the loop's select()."""
        return self.server.fileno()

    def handle(self) -> None:
        """Serve one pending request."""
        self.server.handle()

    def close(self) -> None:
        """Stop listening."""
        self.server.close()


def workers_snapshot(sup: Supervisor) -> tuple[int, dict[str, int]]:
    """Worker processes running, and busy workers per topic."""
    busy: dict[str, int] = {}
    for child in list(sup.children.values()):
        if child.job is not None:
            topic = child.job.claimed.topic
            busy[topic] = busy.get(topic, 0) + 1
    return len(sup.children), busy


def health(sup: Supervisor) -> tuple[bool, str]:
    """/healthz: workers up and not wedged, the database answering; a fixed reason."""
    if sup.stopping:
        return False, f"stopping ({sup.stopping})"
    if not sup.db.answering(time.monotonic(), DATABASE_SILENT_S):
        return False, "database unavailable"
    running = sum(1 for c in list(sup.children.values())
                  if c.booted and not c.retiring and c.kill is None and not c.closed)
    if running < len(sup.slots):
        return False, f"{running} of {len(sup.slots)} workers running"
    return True, f"{running} workers running"
