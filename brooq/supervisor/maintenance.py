"""The supervisor's maintenance, as database tasks: reaper, retention, partitions ahead,
periodic schedules.

Each runs when due, one bounded batch per task, never two of a kind at once,
so none can hold the supervisor's connection for long; work left over is
due again on the next tick.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from brooq import metrics as prom
from brooq.engine.partitions import PartitionUpkeep
from brooq.engine.periodic import Enqueue, PeriodicScheduler
from brooq.engine.reaper import Reaper
from brooq.engine.retention import Retention
from brooq.engine.store import Requeued, TopicCount
from brooq.engine.timer import Every
from brooq.logs import event
from brooq.supervisor.database import Database
from brooq.vocabulary import BrooqError, StoreUnavailable

log = logging.getLogger("brooq.supervisor")

RETENTION_BATCHES_PER_TASK = 5
SCHEDULE_CHECK = timedelta(seconds=1)


class Maintenance:
    """Submits the reaper, retention, the partitions ahead and the periodic scheduler when
    each is due. The partitions are created with retention's store and interval, whether
    retention is on or off."""

    def __init__(
        self,
        db: Database,
        reaper: Reaper,
        retention: Retention,
        scheduler: PeriodicScheduler,
        metrics: prom.Metrics,
    ) -> None:
        self.db, self.reaper, self.retention = db, reaper, retention
        self.scheduler, self.metrics = scheduler, metrics
        self.retention.max_batches = RETENTION_BATCHES_PER_TASK
        self.schedules = Every(SCHEDULE_CHECK)
        self.partitions = PartitionUpkeep(retention.store, retention.partition_interval)

    def run_once(self, now: float) -> list[str]:
        """Submit every task that is due and not already under way; their names."""
        sent = []
        if not self.db.busy("reaper") and self.reaper.every.due(now):
            self.db.submit("reaper", self.reaper.run_once, self._reaped)
            sent.append("reaper")
        if (
            self.retention.enabled
            and not self.db.busy("retention")
            and self.retention.every.due(now)
        ):
            self.db.submit("retention", self.retention.run_once, self._retained)
            sent.append("retention")
        if not self.db.busy("partitions") and self.partitions.every.due(now):
            self.db.submit("partitions", self.partitions.run_once, _ignored)
            sent.append("partitions")
        if self.scheduler.schedules and not self.db.busy("periodic") and self.schedules.due(now):
            self.db.submit(
                "periodic", lambda: self.scheduler.run_once(datetime.now(UTC)), self._scheduled
            )
            sent.append("periodic")
        return sent

    def _reaped(self, done: Requeued | None, error: BaseException | None) -> None:
        if done is None:
            return
        for topic, n in done.pending:
            self.metrics.requeued.labels(topic=topic).inc(n)
        for topic, n in done.dead:
            self.metrics.requeued.labels(topic=topic).inc(n)
            self.metrics.settled.labels(topic=topic, outcome="dead").inc(n)

    def _retained(self, deleted: list[TopicCount] | None, error: BaseException | None) -> None:
        for topic, n in deleted or []:
            self.metrics.retention_deleted.labels(topic=topic).inc(n)

    def _scheduled(self, runs: list[Enqueue] | None, error: BaseException | None) -> None:
        if isinstance(error, BrooqError) and not isinstance(error, StoreUnavailable):
            # A bad schedule must not stop the supervisor: say so, run the others.
            event(log, "PeriodicFailed", logging.ERROR, error=str(error))
        for run in runs or []:
            fields: dict[str, object] = {
                "schedule": run.schedule.name,
                "run": run.run.isoformat(),
                "job_id": run.result.id,
            }
            if run.result.created:
                self.metrics.periodic.labels(schedule=run.schedule.name).inc()
                event(log, "PeriodicEnqueued", logging.INFO, **fields)
            else:
                event(log, "PeriodicAlreadyEnqueued", logging.DEBUG, **fields)


def _ignored(made: list[str] | None, error: BaseException | None) -> None:
    """The partitions task logs what it created; a failure is retried at its next tick."""
