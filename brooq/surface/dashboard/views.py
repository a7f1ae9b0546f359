"""The dashboard as routes of the surface's Router: pages, actions, login and static assets.

Pages (GET, anyone who can reach the address): the overview at ``/ui``, the
job list at ``/ui/jobs`` (the filters of ``brooq jobs list``, keyset paging)
and a job's page at ``/ui/jobs/<id>`` (brooq.surface.dashboard.pages).
Actions (POST, the token's holder only, see brooq.surface.dashboard.access
and brooq.surface.dashboard.actions). Handlers run in the surface's threads,
on ports of their own (never the supervisor loop's connections).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import cache
from importlib.resources import files

from brooq.surface.dashboard.access import Access, Verdict
from brooq.surface.dashboard.actions import Actions
from brooq.surface.dashboard.forms import HTML, redirect
from brooq.surface.dashboard.pages import DashboardPorts, Pages
from brooq.surface.dashboard.pool import PortPool
from brooq.surface.dashboard.render import Screen
from brooq.surface.guard import GuessThrottle
from brooq.surface.router import Router
from brooq.surface.wire import Request, Response
from brooq.vocabulary import JobNotFound, SchemaMissing, StoreUnavailable

log = logging.getLogger("brooq.surface")

SECURITY_HEADERS = [
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
]
JOB_ID = r"(?P<job_id>[0-9a-fA-F-]{1,64})"
TOPIC = r"(?P<topic>[a-z0-9_.-]{1,128})"
"""What may name a topic in a path (checked again as a Topic by the action)."""
STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}

__all__ = ["Dashboard", "DashboardPorts"]


class Dashboard:
    """The dashboard's routes over a pool of ports and one token (None: read-only).

    With a token every page needs a session (see brooq.surface.dashboard.access);
    ``remote`` (HTTP_ALLOW_REMOTE) makes every session cookie Secure.
    """

    def __init__(
        self,
        ports: PortPool,
        token: str | None,
        where: str = "supervisor",
        remote: bool = False,
        throttle: GuessThrottle | None = None,
    ) -> None:
        self.ports, self.access, self.where = ports, Access(token, remote, throttle), where
        self.screen = Screen(self.access, where)
        self.pages = Pages(self.screen)
        self.actions = Actions(self.screen)

    def routes(self, router: Router) -> Router:
        """Add ``/``, ``/ui``, its pages, actions, login and static assets to ``router``."""
        pages, actions, reads = self.pages, self.actions, self._reading
        router.add("GET", "/", lambda r: redirect("/ui"))
        router.add("GET", "/ui", reads(pages.overview))
        router.add("GET", "/ui/", lambda r: redirect("/ui"))
        router.add("GET", "/ui/jobs", reads(pages.jobs))
        router.add_pattern("GET", f"/ui/jobs/{JOB_ID}", reads(pages.job))
        router.add("POST", "/ui/jobs/retry", reads(actions.retry_filtered))
        router.add("POST", "/ui/jobs/purge", reads(actions.purge_filtered))
        router.add("POST", "/ui/versions/retarget", reads(actions.retarget))
        router.add_pattern("POST", f"/ui/jobs/{JOB_ID}/retry", reads(actions.retry_one))
        router.add_pattern("POST", f"/ui/jobs/{JOB_ID}/cancel", reads(actions.cancel_one))
        router.add_pattern("POST", f"/ui/topics/{TOPIC}/pause", reads(actions.pause_topic))
        router.add_pattern("POST", f"/ui/topics/{TOPIC}/resume", reads(actions.resume_topic))
        router.add(("GET", "POST"), "/ui/login", self._page(self.login))
        router.add("POST", "/ui/logout", self._page(self.logout))
        router.add_pattern("GET", r"/ui/static/(?P<name>[a-z]+\.(?:css|js))", static)
        return router

    def _reading(
        self, handler: Callable[[Request, DashboardPorts], Response]
    ) -> Callable[[Request], Response]:
        """``handler`` on ports lent for the request; 503 at once when none is free."""

        def serve(request: Request) -> Response:
            verdict = self.access.verdict(request)
            if verdict is Verdict.THROTTLED:
                return self._throttled(request)
            if verdict is Verdict.ANONYMOUS:
                return self._login_first(request)
            with self.ports.lease() as ports:
                if ports is None:
                    return self._busy(request)
                return handler(request, ports)

        return self._page(serve)

    def _login_first(self, request: Request) -> Response:
        """With a token configured, every page needs a session: a reader goes to the login."""
        if request.method in ("GET", "HEAD"):
            return redirect("/ui/login", "log in with the token to see the dashboard")
        return self.screen.message(request, 401, "Action refused", "log in with the token first")

    def _throttled(self, request: Request) -> Response:
        """A wrong bearer token from an address that sent too many."""
        response = self.screen.message(
            request, 429, "Too many wrong tokens", "too many wrong tokens from this address"
        )
        response.headers.append(("Retry-After", str(math.ceil(self.access.throttle.window_s))))
        return response

    def _busy(self, request: Request) -> Response:
        log.debug("dashboard page shed", extra={"event": "HttpShed", "path": request.path})
        response = self.screen.message(
            request,
            503,
            "Busy",
            f"{self.ports.size} pages are being read already: reload this one in a moment",
        )
        response.headers.append(("Retry-After", "1"))
        return response

    def _page(self, handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def serve(request: Request) -> Response:
            try:
                response = handler(request)
            except JobNotFound as exc:
                response = self.screen.message(request, 404, "Not found", str(exc))
            except SchemaMissing as exc:
                response = self.screen.message(request, 503, "Database not migrated", str(exc))
            except StoreUnavailable as exc:
                log.warning("dashboard: %s", exc, extra={"event": "DatabaseUnavailable"})
                response = self.screen.message(
                    request,
                    503,
                    "Database unavailable",
                    "the database did not answer; this page retries",
                )
            if response.content_type == HTML:
                response.headers.extend(SECURITY_HEADERS)
            return response

        return serve

    def login(self, request: Request) -> Response:
        """The token login: a form, and on POST a new session and its cookie."""
        if request.method == "GET":
            return self.screen.render(request, "login.html", error=None)
        if not self.access.token:
            return self.screen.message(
                request,
                403,
                "Read-only",
                "no BROOQ_TOKEN is configured: there is nothing to log in to",
            )
        answer = self.access.login(request, (request.form().get("token") or [""])[0])
        if answer.cookie is None:
            response = self.screen.render(request, "login.html", answer.status, error=answer.why)
            if answer.retry_after_s:
                response.headers.append(("Retry-After", str(math.ceil(answer.retry_after_s))))
            return response
        response = redirect("/ui", "logged in: actions are enabled")
        response.headers.append(("Set-Cookie", answer.cookie))
        return response

    def logout(self, request: Request) -> Response:
        """End the session (the form's CSRF token needed) and forget its cookie."""
        refused = self.access.logout(request, request.form())
        if refused is not None:
            status, why = refused
            return self.screen.message(request, status, "Logout refused", why)
        response = redirect("/ui/login", "logged out")
        response.headers.append(("Set-Cookie", self.access.clear_cookie(request)))
        return response


@cache
def _asset(name: str) -> bytes:
    return files("brooq.surface.dashboard").joinpath("static", name).read_bytes()


def static(request: Request) -> Response:
    """A file of the package's static directory (CSS, JS): nothing comes from elsewhere."""
    name = request.params["name"]
    if name not in STATIC:
        return Response.json(404, {"error": "not found"})
    return Response(200, _asset(name), [], STATIC[name])
