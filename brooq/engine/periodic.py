"""The periodic scheduler: enqueue each due run of each schedule, exactly once.

Exactly once across supervisors comes from the idempotency key of each run,
not from coordination: every supervisor may try, one row results. Time is
passed in, so tests drive a simulated clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from brooq.vocabulary import Enqueued, InvalidJob, Job, Schedule

MAX_CATCH_UP = 100
CATCH_UP_MARGIN = timedelta(days=1)


def check_schedule(schedule: Schedule) -> None:
    """Raise InvalidJob when the cron expression or the time zone is not valid."""
    try:
        zone = ZoneInfo(schedule.tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidJob(f"schedule {schedule.name!r}: unknown time zone {schedule.tz!r}") from None
    if len(schedule.cron.split()) != 5:
        raise InvalidJob(
            f"schedule {schedule.name!r}: {schedule.cron!r} must have 5 fields "
            "(minute hour day-of-month month day-of-week), e.g. '*/5 * * * *'"
        )
    try:
        next(CronSim(schedule.cron, datetime.now(zone)))
    except (CronSimError, StopIteration) as exc:
        raise InvalidJob(
            f"schedule {schedule.name!r}: invalid cron {schedule.cron!r}: {exc}"
        ) from None


def _local(moment: datetime, zone: ZoneInfo) -> datetime:
    # Arithmetic on aware datetimes is wall-clock arithmetic; do it in UTC, then convert,
    # so that a second after 02:59:59 CEST is 02:00:00 CET, not 03:00:00 CET.
    return moment.astimezone(UTC).astimezone(zone)


def latest_run(schedule: Schedule, now: datetime) -> datetime | None:
    """The latest run time at or before ``now``, in UTC (None if the cron never matched)."""
    zone = ZoneInfo(schedule.tz)
    start = _local(now.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1), zone)
    for found in CronSim(schedule.cron, start, reverse=True):
        if found <= now:
            break
    else:
        return None
    # cronsim's reverse iteration can miss the runs of the hour repeated when the clocks
    # go back (it lands an hour or a day early). Forward iteration, which runs_between
    # uses, does not: walk forward from there to the last run at or before ``now``, so
    # that both agree on every run.
    latest = found.astimezone(UTC)
    for run in CronSim(schedule.cron, found):
        if run > now:
            break
        latest = run.astimezone(UTC)
    return latest


def next_run(schedule: Schedule, now: datetime) -> datetime:
    """The first run time strictly after ``now``, in UTC."""
    return next(CronSim(schedule.cron, _local(now, ZoneInfo(schedule.tz)))).astimezone(UTC)


def runs_between(schedule: Schedule, after: datetime, until: datetime) -> list[datetime]:
    """Run times in ``(after, until]``, in UTC, at most MAX_CATCH_UP (the latest ones).

    The cost is bounded by MAX_CATCH_UP, not by how long ago ``after`` is: the
    forward walk starts a little before the MAX_CATCH_UP-th latest run.
    """
    zone = ZoneInfo(schedule.tz)
    start = after
    back = _local(until.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1), zone)
    for n, found in enumerate(CronSim(schedule.cron, back, reverse=True), start=1):
        if found <= after:
            break
        if n > MAX_CATCH_UP + 2:
            # Two runs and a day of margin for the repeated hour of a DST change,
            # where reverse iteration is unreliable (see latest_run).
            start = max(after, found - CATCH_UP_MARGIN)
            break
    runs: deque[datetime] = deque(maxlen=MAX_CATCH_UP)
    for run in CronSim(schedule.cron, _local(start, zone)):
        if run > until:
            break
        if run > after:
            runs.append(run.astimezone(UTC))
    return list(runs)


@dataclass(frozen=True, slots=True)
class Enqueue:
    """One run the scheduler enqueued (``result.created`` False: another did first)."""

    schedule: Schedule
    run: datetime
    result: Enqueued


class PeriodicScheduler:
    """Enqueues due runs. ``run_once(now)`` returns what it enqueued."""

    def __init__(
        self,
        schedules: Sequence[Schedule],
        enqueue: Callable[[Sequence[Job]], list[Enqueued]],
        last_run: Callable[[Schedule], datetime | None],
    ) -> None:
        self.schedules = list(schedules)
        self.enqueue, self.last_run = enqueue, last_run
        self._seen: dict[str, datetime] = {}

    def due(self, schedule: Schedule, now: datetime) -> list[datetime]:
        """Run times of ``schedule`` to enqueue at ``now``.

        Pure: what this scheduler has seen moves only once the runs are
        enqueued (see run_once), so a failed enqueue is retried next time.
        """
        return self._due(schedule, now)[0]

    def _due(self, schedule: Schedule, now: datetime) -> tuple[list[datetime], datetime | None]:
        latest = latest_run(schedule, now)
        if latest is None:
            return [], None
        seen = self._seen.get(schedule.name)
        if seen is not None:
            if latest <= seen:
                return [], None
            runs = runs_between(schedule, seen, now)
            return (runs if schedule.missed == "all" else runs[-1:]), latest
        return self._first(schedule, latest, now), latest

    def _first(self, schedule: Schedule, latest: datetime, now: datetime) -> list[datetime]:
        if schedule.missed == "skip":
            return []
        if schedule.missed == "all":
            previous = self.last_run(schedule)
            if previous is not None and previous < latest:
                return runs_between(schedule, previous, now)
        return [latest]

    def run_once(self, now: datetime | None = None) -> list[Enqueue]:
        """Enqueue every due run of every schedule; what was enqueued.

        An exception from ``enqueue`` (the database is down) propagates; the
        runs of that schedule and of the ones after it stay due.
        """
        now = now or datetime.now(UTC)
        done: list[Enqueue] = []
        for schedule in self.schedules:
            runs, latest = self._due(schedule, now)
            if runs:
                results = self.enqueue([schedule.job_for(run) for run in runs])
                done += [Enqueue(schedule, r, e) for r, e in zip(runs, results, strict=True)]
            if latest is not None:
                self._seen[schedule.name] = latest  # only forward: _due returns newer ones
        return done
