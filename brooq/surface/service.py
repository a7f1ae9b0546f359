"""The supervisor's service surface: /metrics, /healthz and the token-guarded job endpoints.

The HTTP threads never touch what the supervisor's loop owns. /healthz reads
a snapshot the loop publishes every tick (:class:`HealthBoard`); /metrics,
``GET /jobs/<id>`` and ``POST /jobs/<id>/cancel`` use a store of their own,
on their own connection (opened at the first call that needs it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from brooq import metrics as prom
from brooq.osproc import no_fork
from brooq.postgres.inspection import PostgresInspection
from brooq.postgres.store import PostgresStore
from brooq.surface.guard import GuessThrottle, check_bind, parse_addr, refuse_unless_bearer
from brooq.surface.router import Router
from brooq.surface.server import Limits, SurfaceServer
from brooq.surface.wire import Request, Response
from brooq.vocabulary import BrooqError, JobNotFound, StoreUnavailable

log = logging.getLogger("brooq.surface")

JOB_ID = r"(?P<job_id>[0-9a-fA-F-]{1,64})"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GAUGE_TIMEOUT = timedelta(milliseconds=500)


class HealthBoard:
    """The loop's answer to /healthz, published by the loop, read by the HTTP threads.

    The snapshot is one tuple rebound at each publish, so a reader sees a
    whole snapshot, never half of one. A snapshot older than ``stale_after``
    seconds means the loop stopped ticking: that is unhealthy whatever it said.
    Readers leave the time they asked, so the loop can check the database
    again at its next tick while someone is watching (and rarely otherwise).
    """

    def __init__(self, stale_after: float = 5.0) -> None:
        self.stale_after = stale_after
        self._snapshot: tuple[bool, str, float] = (False, "starting", time.monotonic())
        self._asked_at = 0.0
        self.paused: tuple[str, ...] = ()
        """The topics paused across every host, as the loop last read them (/healthz says
        which: a paused topic is an operator's choice, not a fault)."""

    def publish(self, ok: bool, reason: str, paused: tuple[str, ...] = ()) -> None:
        """Called by the loop (every tick): the current verdict, and the paused topics."""
        self._snapshot = (ok, reason, time.monotonic())
        self.paused = paused

    def paused_topics(self) -> list[str]:
        """The paused topics last published (thread-safe: one tuple rebound)."""
        return list(self.paused)

    def asked_since(self, since: float) -> bool:
        """True when /healthz was read after ``since`` (time.monotonic())."""
        return self._asked_at > since

    def read(self) -> tuple[bool, str]:
        """(ok, reason) for /healthz; thread-safe."""
        self._asked_at = time.monotonic()
        ok, reason, at = self._snapshot
        age = time.monotonic() - at
        if age > self.stale_after:
            return False, f"supervisor loop stalled: no tick for {age:.0f}s"
        return ok, reason


@dataclass(frozen=True)
class ServiceEndpoints:
    """What the service routes call. Every callable runs in an HTTP thread: thread-safe only."""

    metrics: Callable[[], bytes]
    health: Callable[[], tuple[bool, str]]
    get_job: Callable[[str], dict[str, Any]]
    cancel_job: Callable[[str], dict[str, Any]]
    token: str | None
    throttle: GuessThrottle | None = None
    """Counts (and logs) wrong bearer tokens; shared with the dashboard of the same server."""
    paused: Callable[[], Sequence[str]] = tuple
    """The paused topics /healthz names (none by default)."""


def service_routes(router: Router, endpoints: ServiceEndpoints) -> Router:
    """Add /metrics, /healthz, GET /jobs/<id> and POST /jobs/<id>/cancel to ``router``."""

    def metrics(request: Request) -> Response:
        return Response(200, endpoints.metrics(), [], METRICS_TYPE)

    def healthz(request: Request) -> Response:
        ok, reason = endpoints.health()
        body = {"ok": ok, "reason": reason, "paused": list(endpoints.paused())}
        return Response.json(200 if ok else 503, body)

    def get_job(request: Request) -> Response:
        return _guarded(request, endpoints, endpoints.get_job)

    def cancel_job(request: Request) -> Response:
        return _guarded(request, endpoints, endpoints.cancel_job)

    router.add("GET", "/metrics", metrics)
    router.add("GET", "/healthz", healthz)
    router.add_pattern("GET", f"/jobs/{JOB_ID}", get_job)
    router.add_pattern("POST", f"/jobs/{JOB_ID}/cancel", cancel_job)
    return router


def _guarded(
    request: Request, endpoints: ServiceEndpoints, call: Callable[[str], dict[str, Any]]
) -> Response:
    refusal = refuse_unless_bearer(request, endpoints.token, endpoints.throttle)
    if refusal is not None:
        return refusal
    try:
        return Response.json(200, call(request.params["job_id"]))
    except JobNotFound as exc:
        return Response.json(404, {"error": str(exc)})
    except StoreUnavailable as exc:
        # The database's own words stay in the log: they may name hosts and users.
        log.warning("job endpoint: %s", exc, extra={"event": "DatabaseUnavailable"})
        return Response.json(503, {"error": "database unavailable"})
    except BrooqError as exc:
        return Response.json(503, {"error": str(exc)})


class ServiceSurface:
    """The supervisor's HTTP surface on ``addr``, served by threads with a store of its own.

    Construction checks the address (loopback, or ``allow_remote`` with a
    token) and the token (32 bytes) and binds, raising SurfaceConfigError
    before any child is forked; :meth:`start` serves; :meth:`close` stops
    within about a second. A request whose ``Host`` names neither the
    address nor one of ``allowed_hosts`` is answered 421, but on /healthz
    and /metrics.
    ``more_routes`` may add routes (a dashboard) to the same server; give it
    the same ``throttle``, so that wrong tokens count once wherever they are sent.
    """

    def __init__(
        self,
        addr: str,
        *,
        dsn: str,
        topics: prom.Topics,
        supervisor_pid: int,
        health: HealthBoard,
        token: str | None,
        allow_remote: bool = False,
        allowed_hosts: Sequence[str] = (),
        limits: Limits | None = None,
        gauge_timeout: timedelta = GAUGE_TIMEOUT,
        collectors: Sequence[Any] = (),
        more_routes: Callable[[Router], object] | None = None,
        throttle: GuessThrottle | None = None,
    ) -> None:
        check_bind(parse_addr(addr)[0], token, allow_remote)
        # Never the loop's connections: psycopg connections are not shared between threads.
        self.store = PostgresStore(dsn)
        self.inspection = PostgresInspection(dsn, timeout=gauge_timeout)
        scraped = [prom.DatabaseCollector(self.inspection, topics), *collectors]
        endpoints = ServiceEndpoints(
            metrics=lambda: prom.render(scraped, supervisor_pid),
            health=health.read,
            paused=health.paused_topics,
            get_job=self.get_job,
            cancel_job=self.cancel_job,
            token=token,
            throttle=throttle or GuessThrottle(),
        )
        router = service_routes(Router(), endpoints)
        if more_routes is not None:
            more_routes(router)
        # Probes and scrapers reach a supervisor by whatever name they were given, and
        # those answers hold nothing a rebinding page could use: any Host for them.
        self.server = SurfaceServer(
            addr,
            router,
            limits,
            allowed_hosts=allowed_hosts,
            any_host_paths=("/healthz", "/metrics"),
        )
        self.address = self.server.address
        """``host:port`` actually bound."""

    def get_job(self, job_id: str) -> dict[str, Any]:
        """GET /jobs/{id}: the row."""
        with no_fork():
            return self.store.get(job_id).as_dict()

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """POST /jobs/{id}/cancel: cancel if not terminal; the state it is in now."""
        with no_fork():
            canceled = self.store.cancel(job_id, "canceled through the HTTP endpoint")
            state = self.store.get(job_id).state
        return {"id": job_id, "canceled": canceled, "state": str(state)}

    def start(self) -> ServiceSurface:
        """Serve in the server's threads."""
        self.server.start()
        return self

    def close(self) -> None:
        """Stop serving (≤ ~1 s even with slow clients attached), then close the store."""
        self.server.close()
        self.store.close()
        self.inspection.close()
