"""The periodic scheduler: enqueue each due run of each schedule, exactly once.

Exactly once across supervisors comes from the idempotency key of each run,
not from coordination: every supervisor may try, one row results. Time is
passed in, so tests drive a simulated clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from brooq.vocabulary import Enqueued, InvalidJob, Job, Schedule

MAX_CATCH_UP = 100


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


def latest_run(schedule: Schedule, now: datetime) -> datetime | None:
    """The latest run time at or before ``now``, in UTC."""
    local = now.astimezone(ZoneInfo(schedule.tz)).replace(microsecond=0) + timedelta(seconds=1)
    try:
        return next(CronSim(schedule.cron, local, reverse=True)).astimezone(UTC)
    except StopIteration:
        return None


def runs_between(schedule: Schedule, after: datetime, until: datetime) -> list[datetime]:
    """Run times in ``(after, until]``, in UTC, at most MAX_CATCH_UP (the latest ones)."""
    runs: list[datetime] = []
    for run in CronSim(schedule.cron, after.astimezone(ZoneInfo(schedule.tz))):
        if run > until:
            break
        runs.append(run.astimezone(UTC))
        if len(runs) > MAX_CATCH_UP:
            runs.pop(0)
    return runs


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
        """Run times of ``schedule`` to enqueue now (updates what this scheduler has seen)."""
        latest = latest_run(schedule, now)
        if latest is None:
            return []
        seen = self._seen.get(schedule.name)
        self._seen[schedule.name] = latest
        if seen is not None:
            if latest <= seen:
                return []
            runs = runs_between(schedule, seen, now)
            return runs if schedule.missed == "all" else runs[-1:]
        return self._first(schedule, latest, now)

    def _first(self, schedule: Schedule, latest: datetime, now: datetime) -> list[datetime]:
        if schedule.missed == "skip":
            return []
        if schedule.missed == "all":
            previous = self.last_run(schedule)
            if previous is not None and previous < latest:
                return runs_between(schedule, previous, now)
        return [latest]

    def run_once(self, now: datetime | None = None) -> list[Enqueue]:
        """Enqueue every due run of every schedule."""
        now = now or datetime.now(UTC)
        done: list[Enqueue] = []
        for schedule in self.schedules:
            runs = self.due(schedule, now)
            if runs:
                results = self.enqueue([schedule.job_for(run) for run in runs])
                done += [Enqueue(schedule, r, e) for r, e in zip(runs, results, strict=True)]
        return done

    def next_runs(self, now: datetime | None = None) -> list[tuple[Schedule, datetime]]:
        """Each schedule with its next run time after ``now`` (for ``brooq status``)."""
        now = now or datetime.now(UTC)
        out = []
        for schedule in self.schedules:
            local = now.astimezone(ZoneInfo(schedule.tz))
            out.append((schedule, next(CronSim(schedule.cron, local)).astimezone(UTC)))
        return out
