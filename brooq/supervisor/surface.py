"""The supervisor's service surface: /healthz, /metrics and the dashboard at /ui.

The HTTP server runs in threads of its own (brooq.surface); the loop only
publishes a health verdict each tick, and the metrics read a snapshot of
what the workers do through a callback. Health is judged from the
supervisor's own state (workers up and not wedged, the database lanes
answering), never by a query in an HTTP thread, and never carries database
error text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from brooq import metrics as prom
from brooq.config import Settings
from brooq.supervisor.children import ChildProcess
from brooq.surface.dashboard import Dashboard
from brooq.surface.dashboard.pool import PortPool
from brooq.surface.dashboard.ports import close_ports, postgres_ports
from brooq.surface.guard import GuessThrottle
from brooq.surface.service import HealthBoard, ServiceSurface

DATABASE_SILENT_S = 10.0
"""/healthz fails when the database lanes have not finished a task for this long."""
OUTCOMES_LATE_S = 10.0
"""/healthz fails while an outcome has waited this long to be written (they are written within
milliseconds: a flush that keeps failing or waiting, say on rows another session locked)."""

WorkersSnapshot = Callable[[], tuple[int, dict[str, int]]]
"""Worker processes running, and busy workers per topic (called from an HTTP thread)."""


class Surface:
    """The HTTP surface of one supervisor, and the health board its loop keeps current."""

    def __init__(self, service: ServiceSurface, board: HealthBoard) -> None:
        self.service, self.board = service, board
        self.address = service.address
        self.ports: PortPool | None = None

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        dsn: str,
        topics: Callable[[], list[str]],
        supervisor_pid: int,
        workers: WorkersSnapshot,
        app_version: str | None = None,
    ) -> Surface | None:
        """Bind HTTP_ADDR (SurfaceConfigError before any worker is forked); None when off.

        ``topics`` is read at every scrape: every metric has a series for every topic
        served, from the first scrape after a reload adds one."""
        if not settings.http_addr:
            return None
        board = HealthBoard()
        throttle = GuessThrottle()  # one count of wrong tokens for /jobs and /ui alike
        ports = postgres_ports(dsn)  # the dashboard's own connections, never the loop's
        service = ServiceSurface(
            settings.http_addr,
            dsn=dsn,
            topics=topics,
            supervisor_pid=supervisor_pid,
            health=board,
            token=settings.token,
            allow_remote=settings.http_allow_remote,
            allowed_hosts=settings.http_allowed_hosts or (),
            collectors=[prom.WorkersCollector(workers, topics, app_version)],
            more_routes=Dashboard(
                ports, settings.token, remote=settings.http_allow_remote, throttle=throttle
            ).routes,
            throttle=throttle,
        )
        surface = cls(service, board)
        surface.ports = ports
        return surface

    def start(self) -> None:
        """Serve in the server's threads."""
        self.service.start()

    def publish(self, healthy: bool, reason: str, paused: tuple[str, ...] = ()) -> None:
        """The loop's verdict for /healthz, once per tick, and the paused topics it names."""
        self.board.publish(healthy, reason, paused)

    def asked_since(self, since: float) -> bool:
        """True when /healthz was read after ``since``: worth a fresh look at the database."""
        return self.board.asked_since(since)

    def close(self) -> None:
        """Stop serving (within about a second, slow clients or not)."""
        self.service.close()
        if self.ports is not None:
            close_ports(self.ports)


def busy_by_topic(children: Iterable[ChildProcess]) -> tuple[int, dict[str, int]]:
    """Worker processes running, and busy workers per topic."""
    count, busy = 0, dict[str, int]()
    for child in list(children):
        count += 1
        job = child.job
        if job is not None:
            busy[job.claimed.topic] = busy.get(job.claimed.topic, 0) + 1
    return count, busy


def health(
    stopping: str | None,
    answering: bool,
    children: Iterable[ChildProcess],
    slots: int,
    unwritten_s: float = 0.0,
) -> tuple[bool, str]:
    """/healthz: not stopping, the database answering, outcomes written (none waiting for
    OUTCOMES_LATE_S: ``unwritten_s`` is the oldest one's wait), every slot's worker up and
    not wedged; a fixed reason (never a database error's text)."""
    if stopping:
        return False, f"stopping ({stopping})"
    if not answering:
        return False, "database unavailable"
    if unwritten_s >= OUTCOMES_LATE_S:
        return False, f"outcomes not written for {int(unwritten_s)}s"
    running = sum(
        1 for c in children if c.booted and not c.retiring and c.kill is None and not c.closed
    )
    if running < slots:
        return False, f"{running} of {slots} workers running"
    return True, f"{running} workers running"
