"""The dashboard's actions (POST, the token's holder only): retry and cancel one job, retry
or purge the filtered ones, pause and resume a topic.

An action first answers a confirmation page; only the form posted from it
with ``confirm=yes`` changes anything.
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlencode

from brooq.engine.admin import PURGEABLE, RETRYABLE
from brooq.engine.filters import JobFilter
from brooq.surface.dashboard.forms import FILTER_FIELDS, back, confirmed, query_filter, redirect
from brooq.surface.dashboard.pages import UNVERSIONED, DashboardPorts
from brooq.surface.dashboard.render import Screen
from brooq.surface.wire import Request, Response
from brooq.vocabulary import InvalidInput, State, app_version, pause_request

MAX_ROWS_PER_ACTION = 5000
"""A bulk action from the page changes at most this many rows (repeat it for more)."""


class Actions:
    """The actions, over the ports lent to each, refused unless the session may act."""

    def __init__(self, screen: Screen) -> None:
        self.screen = screen

    def _authorize(self, request: Request) -> tuple[dict[str, list[str]], Response | None]:
        form = request.form()
        refusal = self.screen.access.refuse_write(request, form)
        if refusal is None:
            return form, None
        status, why = refusal
        return form, self.screen.message(request, status, "Action refused", why)

    def retry_one(self, request: Request, ports: DashboardPorts) -> Response:
        """Retry one dead (or canceled) job: pending now, attempts reset."""
        form, refused = self._authorize(request)
        if refused:
            return refused
        record = ports.inspection.job(request.params["job_id"])
        target = f"/ui/jobs/{record.id}"
        if record.state not in RETRYABLE:
            return redirect(
                target, f"job is {record.state}: only dead or canceled jobs are retried"
            )
        if not confirmed(form):
            return self._confirm(
                request, f"Retry job {record.id} ({record.topic}, {record.state})?", "retry", []
            )
        where = JobFilter(ids=(record.id,), state=State(record.state), limit=1)
        retried = ports.admin.retry(where)
        return redirect(
            target,
            "retried: the job is pending again"
            if retried
            else "not retried: the job changed meanwhile",
        )

    def cancel_one(self, request: Request, ports: DashboardPorts) -> Response:
        """Cancel one job that is not terminal (a running handler is interrupted)."""
        form, refused = self._authorize(request)
        if refused:
            return refused
        record = ports.inspection.job(request.params["job_id"])
        target = f"/ui/jobs/{record.id}"
        if not confirmed(form):
            return self._confirm(
                request, f"Cancel job {record.id} ({record.topic}, {record.state})?", "cancel", []
            )
        canceled = ports.admin.cancel(record.id, "canceled from the dashboard")
        return redirect(
            target, "canceled" if canceled else f"not canceled: the job is already {record.state}"
        )

    def pause_topic(self, request: Request, ports: DashboardPorts) -> Response:
        """Pause a topic on every host (with the reason posted), after a confirmation."""
        form, refused = self._authorize(request)
        if refused:
            return refused
        topic, reason = request.params["topic"], (form.get("reason") or [""])[0]
        try:
            pause_request(topic, reason)
        except InvalidInput as exc:
            return self.screen.message(request, 400, "Bad pause", str(exc))
        if not confirmed(form):
            return self._confirm(
                request,
                f"Pause topic {topic}? No supervisor starts a new job of it until it is "
                "resumed; running jobs finish.",
                "pause",
                [("reason", reason)],
            )
        ports.admin.pause(topic, reason or None, by="the dashboard")
        return redirect("/ui", f"paused {topic}: no new job of it starts on any host")

    def resume_topic(self, request: Request, ports: DashboardPorts) -> Response:
        """Resume a paused topic, after a confirmation."""
        form, refused = self._authorize(request)
        if refused:
            return refused
        topic = request.params["topic"]
        try:
            pause_request(topic, None)
        except InvalidInput as exc:
            return self.screen.message(request, 400, "Bad resume", str(exc))
        if not confirmed(form):
            return self._confirm(request, f"Resume topic {topic}?", "resume", [])
        lifted = ports.admin.resume(topic)
        return redirect("/ui", f"resumed {topic}" if lifted else f"{topic} was not paused")

    def retarget(self, request: Request, ports: DashboardPorts) -> Response:
        """Move the jobs not started yet of one app version to another (``brooq jobs
        retarget``), at most MAX_ROWS_PER_ACTION a click."""
        form, refused = self._authorize(request)
        if refused:
            return refused
        given = [form.get(name, [""])[0] for name in ("from_version", "to_version")]
        try:
            source, target = (None if v == UNVERSIONED else app_version(v) for v in given)
        except InvalidInput as exc:
            return self.screen.message(request, 400, "Bad version", str(exc))
        if not all(given) or source == target:
            why = "name two different versions (one may be " + UNVERSIONED + ")"
            return self.screen.message(request, 400, "Bad version", why)
        where = JobFilter(limit=MAX_ROWS_PER_ACTION)
        pairs = [("from_version", given[0]), ("to_version", given[1])]
        if not confirmed(form):
            count = ports.admin.count_retargetable(where, source)
            return self._confirm(
                request,
                f"Move {count} job{'s' * (count != 1)} not started yet from {given[0]} to "
                f"{given[1]}?",
                "retarget",
                pairs,
                count=count,
            )
        done = ports.admin.retarget(where, source, target)
        note = f"retargeted {done} job{'s' * (done != 1)} from {given[0]} to {given[1]}"
        if done >= MAX_ROWS_PER_ACTION:
            note += f" (at most {MAX_ROWS_PER_ACTION} per click: repeat for the rest)"
        return redirect("/ui", note)

    def retry_filtered(self, request: Request, ports: DashboardPorts) -> Response:
        """Retry every dead (or canceled) job the posted filters match."""
        return self._bulk(request, ports, "retry", RETRYABLE)

    def purge_filtered(self, request: Request, ports: DashboardPorts) -> Response:
        """Delete every terminal job the posted filters match, in batches."""
        return self._bulk(request, ports, "purge", PURGEABLE)

    def _bulk(
        self, request: Request, ports: DashboardPorts, action: str, states: tuple[State, ...]
    ) -> Response:
        form, refused = self._authorize(request)
        if refused:
            return refused
        pairs = [(k, v) for k in FILTER_FIELDS for v in form.get(k, [])]
        try:
            where = query_filter(
                {k: [v for kk, v in pairs if kk == k] for k, _ in pairs}, states=states
            )
        except InvalidInput as exc:
            return self.screen.message(request, 400, "Bad filter", str(exc))
        if where.state is None:
            return self.screen.message(
                request,
                400,
                "Bad filter",
                f"{action} needs a state: one of " + ", ".join(str(s) for s in states),
            )
        where = replace(where, limit=MAX_ROWS_PER_ACTION, after=None)
        if not confirmed(form):
            count = ports.inspection.count_jobs(replace(where, limit=0))
            verb = "Retry" if action == "retry" else "Delete"
            return self._confirm(
                request,
                f"{verb} {count} {where.state} job{'s' * (count != 1)} matching this filter?",
                action,
                pairs,
                count=count,
            )
        if action == "retry":
            done = len(ports.admin.retry(where))
            note = f"retried {done} job{'s' * (done != 1)}"
        else:
            done = ports.admin.purge(where)
            note = f"purged {done} job{'s' * (done != 1)}"
        if done >= MAX_ROWS_PER_ACTION:
            note += f" (at most {MAX_ROWS_PER_ACTION} per click: repeat for the rest)"
        return redirect("/ui/jobs?" + urlencode(pairs), note)

    def _confirm(
        self,
        request: Request,
        question: str,
        action: str,
        pairs: list[tuple[str, str]],
        count: int | None = None,
    ) -> Response:
        return self.screen.render(
            request,
            "confirm.html",
            question=question,
            action=request.path,
            verb=action,
            pairs=pairs,
            count=count,
            back=back(request),
        )
