"""The dashboard's pages (GET): the overview, the job list and a job's page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlencode

from brooq.engine.admin import PURGEABLE, RETRYABLE, Admin
from brooq.engine.inspection import Inspection, SkippedRow, SupervisorRow, VersionCount
from brooq.surface.dashboard.forms import filter_pairs, form_values, query_filter
from brooq.surface.dashboard.render import Screen, chart
from brooq.surface.wire import Request, Response
from brooq.vocabulary import InvalidInput, SchemaMissing, State, StoreUnavailable

STATES = tuple(str(s) for s in State)
CHART_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class DashboardPorts:
    """What the dashboard reads and changes; each object must be safe to share between threads."""

    inspection: Inspection
    admin: Admin


class Pages:
    """The read-only pages, each over the Inspection of the ports lent to it."""

    def __init__(self, screen: Screen) -> None:
        self.screen = screen

    def overview(self, request: Request, ports: DashboardPorts) -> Response:
        """Counts per topic × state, oldest ready age, paused topics (with the buttons that
        pause and resume), rate limits, throughput, live workers."""
        inspection = ports.inspection
        depth = inspection.depth()
        ready = inspection.oldest_ready()
        rates = inspection.rate_limits()
        pauses = {p.topic: p for p in inspection.pauses()}
        minutes = inspection.throughput(CHART_WINDOW)
        supervisors, skipped = _live(inspection)
        versions = _versions(inspection.pending_by_version(), supervisors or [])
        counts: dict[str, dict[str, int]] = {}
        for row in depth:
            counts.setdefault(row.topic, dict.fromkeys(STATES, 0))[row.state] = row.jobs
        for topic in [*ready, *pauses]:
            counts.setdefault(topic, dict.fromkeys(STATES, 0))
        served = {t for s in supervisors or [] for t in s.topics}
        unserved = sorted(t for t in ready if t not in served) if supervisors is not None else []
        totals = {s: sum(c[s] for c in counts.values()) for s in STATES}
        return self.screen.render(
            request,
            "overview.html",
            counts=dict(sorted(counts.items())),
            states=STATES,
            totals=totals,
            ready=ready,
            rates=rates,
            pauses=pauses,
            unserved=unserved,
            supervisors=supervisors,
            skipped=skipped,
            versions=versions,
            unversioned=UNVERSIONED,
            chart=chart(minutes),
        )

    def jobs(self, request: Request, ports: DashboardPorts) -> Response:
        """A page of jobs under the filters of the query string."""
        try:
            where = query_filter(request.query)
        except InvalidInput as exc:
            return self.screen.render(
                request,
                "jobs.html",
                400,
                error=str(exc),
                page=None,
                total=None,
                form=form_values(request.query),
                topics=_topics(ports),
                states=STATES,
                next_url=None,
                bulk=None,
                query="",
            )
        listing = ports.inspection.list_jobs(where)
        total = ports.inspection.count_jobs(where)
        next_url = None
        if listing.next is not None:
            next_url = "/ui/jobs?" + urlencode(
                [*filter_pairs(request.query), ("after", listing.next.encode())]
            )
        bulk = str(where.state) if where.state in (*RETRYABLE, *PURGEABLE) else None
        return self.screen.render(
            request,
            "jobs.html",
            error=None,
            page=listing,
            total=total,
            form=form_values(request.query),
            topics=_topics(ports),
            states=STATES,
            next_url=next_url,
            bulk=bulk,
            query=urlencode(filter_pairs(request.query)),
        )

    def job(self, request: Request, ports: DashboardPorts) -> Response:
        """One job's whole row, and its parents and children with their states."""
        record = ports.inspection.job(request.params["job_id"])
        family = ports.inspection.family(record.id)
        return self.screen.render(
            request, "job.html", job=record, state=str(record.state), family=family
        )


def _topics(ports: DashboardPorts) -> list[str]:
    try:
        return sorted({row.topic for row in ports.inspection.depth()})
    except StoreUnavailable:
        return []


UNVERSIONED = "(unversioned)"
"""How the pages and the retarget form name jobs and supervisors without a version (no
version can be spelled so: brooq.vocabulary.versions)."""


@dataclass(frozen=True)
class VersionLine:
    """One app version on the overview: the jobs waiting for it, its live supervisors."""

    name: str
    jobs: int
    supervisors: int


def _versions(waiting: list[VersionCount], live: list[SupervisorRow]) -> list[VersionLine]:
    """Every version with jobs waiting or a live supervisor, unversioned first; empty when
    no job and no supervisor has one (versions are off: the section is not shown)."""
    jobs: dict[str | None, int] = {}
    for row in waiting:
        jobs[row.app_version] = jobs.get(row.app_version, 0) + row.jobs
    names = set(jobs) | {s.app_version for s in live}
    if names <= {None}:
        return []
    return [
        VersionLine(
            UNVERSIONED if v is None else v,
            jobs.get(v, 0),
            len(live) if v is None else sum(1 for s in live if s.app_version == v),
        )
        for v in sorted(names, key=lambda v: (v is not None, v or ""))
    ]


def _live(inspection: Inspection) -> tuple[list[SupervisorRow] | None, list[SkippedRow]]:
    """The live supervisors (None: no such table), and the rows that could not be read."""
    try:
        found = inspection.supervisor_rows()
    except SchemaMissing:
        return None, []
    return [row for row in found.rows if row.alive], found.skipped
