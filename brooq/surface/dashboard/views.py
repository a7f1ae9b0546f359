"""The dashboard's pages and actions, as routes of the surface's Router.

Pages (GET, anyone who can reach the address): the overview at ``/ui``, the
job list at ``/ui/jobs`` (the filters of ``brooq jobs list``, keyset paging)
and a job's page at ``/ui/jobs/<id>``. Actions (POST, the token's holder
only, see brooq.surface.dashboard.access): retry and cancel one job, retry
the filtered dead (or canceled) jobs, purge the filtered terminal ones. An
action first answers a confirmation page; only the form posted from it with
``confirm=yes`` changes anything. Handlers run in the surface's threads, on
ports of their own (never the supervisor loop's connections).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import cache
from importlib.resources import files
from typing import Any
from urllib.parse import urlencode, urlsplit

from brooq.engine.admin import PURGEABLE, RETRYABLE, Admin
from brooq.engine.filters import JobFilter, filter_of
from brooq.engine.inspection import Inspection, SupervisorRow
from brooq.surface.dashboard.access import Access, Verdict
from brooq.surface.dashboard.render import chart, page
from brooq.surface.router import Router
from brooq.surface.wire import Request, Response
from brooq.vocabulary import InvalidInput, JobNotFound, SchemaMissing, State, StoreUnavailable

log = logging.getLogger("brooq.surface")

HTML = "text/html; charset=utf-8"
STATES = tuple(str(s) for s in State)
MAX_ROWS_PER_ACTION = 5000
"""A bulk action from the page changes at most this many rows (repeat it for more)."""
CHART_WINDOW = timedelta(hours=1)
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
STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}


@dataclass(frozen=True)
class DashboardPorts:
    """What the dashboard reads and changes; each object must be safe to share between threads."""

    inspection: Inspection
    admin: Admin


class Dashboard:
    """The dashboard's routes for one set of ports and one token (None: read-only)."""

    def __init__(self, ports: DashboardPorts, token: str | None, where: str = "supervisor") -> None:
        self.ports, self.access, self.where = ports, Access(token or None), where

    def routes(self, router: Router) -> Router:
        """Add ``/``, ``/ui``, its pages, actions, login and static assets to ``router``."""
        router.add("GET", "/", lambda r: redirect("/ui"))
        router.add("GET", "/ui", self._page(self.overview))
        router.add("GET", "/ui/", lambda r: redirect("/ui"))
        router.add("GET", "/ui/jobs", self._page(self.jobs))
        router.add_pattern("GET", f"/ui/jobs/{JOB_ID}", self._page(self.job))
        router.add("POST", "/ui/jobs/retry", self._page(self.retry_filtered))
        router.add("POST", "/ui/jobs/purge", self._page(self.purge_filtered))
        router.add_pattern("POST", f"/ui/jobs/{JOB_ID}/retry", self._page(self.retry_one))
        router.add_pattern("POST", f"/ui/jobs/{JOB_ID}/cancel", self._page(self.cancel_one))
        router.add(("GET", "POST"), "/ui/login", self._page(self.login))
        router.add("POST", "/ui/logout", self._page(self.logout))
        router.add_pattern("GET", r"/ui/static/(?P<name>[a-z]+\.(?:css|js))", static)
        return router

    # --- plumbing -------------------------------------------------------------------------

    def _page(self, handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def serve(request: Request) -> Response:
            try:
                response = handler(request)
            except JobNotFound as exc:
                response = self._message(request, 404, "Not found", str(exc))
            except SchemaMissing as exc:
                response = self._message(request, 503, "Database not migrated", str(exc))
            except StoreUnavailable as exc:
                log.warning("dashboard: %s", exc, extra={"event": "DatabaseUnavailable"})
                response = self._message(
                    request,
                    503,
                    "Database unavailable",
                    "the database did not answer; this page retries",
                )
            if response.content_type == HTML:
                response.headers.extend(SECURITY_HEADERS)
            return response

        return serve

    def _render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        verdict = self.access.verdict(request)
        html = page(
            template,
            verdict=str(verdict),
            can_act=verdict is Verdict.ALLOWED,
            csrf=self.access.csrf_for(request) if verdict is Verdict.ALLOWED else "",
            where=self.where,
            path=request.path,
            notice=_first(request.query, "notice"),
            **context,
        )
        return Response(status, html.encode(), [], HTML)

    def _message(self, request: Request, status: int, title: str, text: str) -> Response:
        return self._render(request, "message.html", status, title=title, text=text)

    # --- pages ----------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        """Counts per topic × state, oldest ready age, throughput, live workers."""
        inspection = self.ports.inspection
        depth = inspection.depth()
        ready = inspection.oldest_ready()
        minutes = inspection.throughput(CHART_WINDOW)
        supervisors = _live(inspection)
        counts: dict[str, dict[str, int]] = {}
        for row in depth:
            counts.setdefault(row.topic, dict.fromkeys(STATES, 0))[row.state] = row.jobs
        for topic in ready:
            counts.setdefault(topic, dict.fromkeys(STATES, 0))
        served = {t for s in supervisors or [] for t in s.topics}
        unserved = sorted(t for t in ready if t not in served) if supervisors is not None else []
        totals = {s: sum(c[s] for c in counts.values()) for s in STATES}
        return self._render(
            request,
            "overview.html",
            counts=dict(sorted(counts.items())),
            states=STATES,
            totals=totals,
            ready=ready,
            unserved=unserved,
            supervisors=supervisors,
            chart=chart(minutes),
        )

    def jobs(self, request: Request) -> Response:
        """A page of jobs under the filters of the query string."""
        try:
            where = query_filter(request.query)
        except InvalidInput as exc:
            return self._render(
                request,
                "jobs.html",
                400,
                error=str(exc),
                page=None,
                total=None,
                form=_form(request.query),
                topics=self._topics(),
                states=STATES,
                next_url=None,
                bulk=None,
                query="",
            )
        listing = self.ports.inspection.list_jobs(where)
        total = self.ports.inspection.count_jobs(where)
        form = _form(request.query)
        next_url = None
        if listing.next is not None:
            next_url = "/ui/jobs?" + urlencode(
                [*_filter_pairs(request.query), ("after", listing.next.encode())]
            )
        bulk = str(where.state) if where.state in (*RETRYABLE, *PURGEABLE) else None
        return self._render(
            request,
            "jobs.html",
            error=None,
            page=listing,
            total=total,
            form=form,
            topics=self._topics(),
            states=STATES,
            next_url=next_url,
            bulk=bulk,
            query=urlencode(_filter_pairs(request.query)),
        )

    def job(self, request: Request) -> Response:
        """One job's whole row."""
        record = self.ports.inspection.job(request.params["job_id"])
        return self._render(request, "job.html", job=record, state=str(record.state))

    def _topics(self) -> list[str]:
        try:
            return sorted({row.topic for row in self.ports.inspection.depth()})
        except StoreUnavailable:
            return []

    # --- actions --------------------------------------------------------------------------

    def _authorize(self, request: Request) -> tuple[dict[str, list[str]], Response | None]:
        form = request.form()
        refusal = self.access.refuse_write(request, form)
        if refusal is None:
            return form, None
        status, why = refusal
        return form, self._message(request, status, "Action refused", why)

    def retry_one(self, request: Request) -> Response:
        """Retry one dead (or canceled) job: pending now, attempts reset."""
        form, refused = self._authorize(request)
        if refused:
            return refused
        record = self.ports.inspection.job(request.params["job_id"])
        target = f"/ui/jobs/{record.id}"
        if record.state not in RETRYABLE:
            return redirect(
                target, f"job is {record.state}: only dead or canceled jobs are retried"
            )
        if not _confirmed(form):
            return self._confirm(
                request, f"Retry job {record.id} ({record.topic}, {record.state})?", "retry", []
            )
        where = JobFilter(ids=(record.id,), state=State(record.state), limit=1)
        retried = self.ports.admin.retry(where)
        return redirect(
            target,
            "retried: the job is pending again"
            if retried
            else "not retried: the job changed meanwhile",
        )

    def cancel_one(self, request: Request) -> Response:
        """Cancel one job that is not terminal (a running handler is interrupted)."""
        form, refused = self._authorize(request)
        if refused:
            return refused
        record = self.ports.inspection.job(request.params["job_id"])
        target = f"/ui/jobs/{record.id}"
        if not _confirmed(form):
            return self._confirm(
                request, f"Cancel job {record.id} ({record.topic}, {record.state})?", "cancel", []
            )
        canceled = self.ports.admin.cancel(record.id, "canceled from the dashboard")
        return redirect(
            target, "canceled" if canceled else f"not canceled: the job is already {record.state}"
        )

    def retry_filtered(self, request: Request) -> Response:
        """Retry every dead (or canceled) job the posted filters match."""
        return self._bulk(request, "retry", RETRYABLE)

    def purge_filtered(self, request: Request) -> Response:
        """Delete every terminal job the posted filters match, in batches."""
        return self._bulk(request, "purge", PURGEABLE)

    def _bulk(self, request: Request, action: str, states: tuple[State, ...]) -> Response:
        form, refused = self._authorize(request)
        if refused:
            return refused
        pairs = [(k, v) for k in ("topic", "state", "since", "until") for v in form.get(k, [])]
        try:
            where = query_filter(
                {k: [v for kk, v in pairs if kk == k] for k, _ in pairs}, states=states
            )
        except InvalidInput as exc:
            return self._message(request, 400, "Bad filter", str(exc))
        if where.state is None:
            return self._message(
                request,
                400,
                "Bad filter",
                f"{action} needs a state: one of " + ", ".join(str(s) for s in states),
            )
        where = replace(where, limit=MAX_ROWS_PER_ACTION, after=None)
        back = "/ui/jobs?" + urlencode(pairs)
        if not _confirmed(form):
            count = self.ports.inspection.count_jobs(replace(where, limit=0))
            verb = "Retry" if action == "retry" else "Delete"
            return self._confirm(
                request,
                f"{verb} {count} {where.state} job{'s' * (count != 1)} matching this filter?",
                action,
                pairs,
                count=count,
            )
        if action == "retry":
            done = len(self.ports.admin.retry(where))
            note = f"retried {done} job{'s' * (done != 1)}"
        else:
            done = self.ports.admin.purge(where)
            note = f"purged {done} job{'s' * (done != 1)}"
        if done >= MAX_ROWS_PER_ACTION:
            note += f" (at most {MAX_ROWS_PER_ACTION} per click: repeat for the rest)"
        return redirect(back, note)

    def _confirm(
        self,
        request: Request,
        question: str,
        action: str,
        pairs: list[tuple[str, str]],
        count: int | None = None,
    ) -> Response:
        return self._render(
            request,
            "confirm.html",
            question=question,
            action=request.path,
            verb=action,
            pairs=pairs,
            count=count,
            back=_back(request),
        )

    def login(self, request: Request) -> Response:
        """The token login: a form, and on POST the session cookie."""
        if request.method == "GET":
            return self._render(request, "login.html", error=None)
        if not self.access.token:
            return self._message(
                request,
                403,
                "Read-only",
                "no BROOQ_TOKEN is configured: there is nothing to log in to",
            )
        given = (request.form().get("token") or [""])[0]
        if not self.access.login_ok(given):
            return self._render(request, "login.html", 401, error="wrong token")
        response = redirect("/ui", "logged in: actions are enabled")
        response.headers.append(("Set-Cookie", self.access.set_cookie()))
        return response

    def logout(self, request: Request) -> Response:
        """Forget the session cookie."""
        response = redirect("/ui", "logged out")
        response.headers.append(("Set-Cookie", Access.clear_cookie()))
        return response


def query_filter(
    query: dict[str, list[str]], states: tuple[State, ...] = tuple(State)
) -> JobFilter:
    """The JobFilter of a query string or form; InvalidInput for any bad value."""

    def one(name: str) -> str | None:
        value = (query.get(name) or [""])[0].strip()
        return value or None

    limit = one("limit")
    if limit is not None and not limit.isdigit():
        raise InvalidInput(f"limit {limit!r}: give a positive number")
    return filter_of(
        topics=[t for v in query.get("topic", []) for t in v.split(",")],
        state=one("state"),
        since=one("since"),
        until=one("until"),
        limit=int(limit) if limit else None,
        after=one("after"),
        states=states,
        default_limit=50,
        flag="",
    )


def _filter_pairs(query: dict[str, list[str]]) -> list[tuple[str, str]]:
    return [
        (k, v)
        for k in ("topic", "state", "since", "until", "limit")
        for v in query.get(k, [])
        if v.strip()
    ]


def _form(query: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "topics": [t for v in query.get("topic", []) for t in v.split(",") if t],
        **{k: (query.get(k) or [""])[0] for k in ("state", "since", "until", "limit")},
    }


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0][:300] if values else None


def _back(request: Request) -> str:
    """Where "go back" leads: the referring page when it is one of the dashboard's, else /ui."""
    parts = urlsplit(request.header("referer") or "")
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return target if _SAFE_PATH.fullmatch(target) else "/ui"


def _confirmed(form: dict[str, list[str]]) -> bool:
    return (form.get("confirm") or [""])[0] == "yes"


def _live(inspection: Inspection) -> list[SupervisorRow] | None:
    try:
        return [row for row in inspection.supervisors() if row.alive]
    except SchemaMissing:
        return None


_SAFE_PATH = re.compile(r"/ui(/[A-Za-z0-9/_-]*)?(\?[^\r\n]*)?")


def redirect(location: str, notice: str | None = None) -> Response:
    """303 See Other to a path of the dashboard (never elsewhere), with a notice to show."""
    if not _SAFE_PATH.fullmatch(location):
        location = "/ui"
    if notice:
        location += ("&" if "?" in location else "?") + urlencode({"notice": notice})
    return Response(303, b"", [("Location", location)], HTML)


@cache
def _asset(name: str) -> bytes:
    return files("brooq.surface.dashboard").joinpath("static", name).read_bytes()


def static(request: Request) -> Response:
    """A file of the package's static directory (CSS, JS): nothing comes from elsewhere."""
    name = request.params["name"]
    if name not in STATIC:
        return Response.json(404, {"error": "not found"})
    return Response(200, _asset(name), [], STATIC[name])
