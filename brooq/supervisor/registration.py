"""The supervisor's row in ``brooq_supervisor``: who is alive against this database, doing what.

Every PERIOD the loop takes a snapshot of its workers (pid, slot, current
job, topic, since when) and hands one upsert to the database thread; the
loop never waits for it. At a clean stop, once the last worker is gone, the
row is deleted. A supervisor killed without a clean stop leaves its row:
readers count it dead once ``seen_at`` is older than 3 × PERIOD, and every
supervisor's upsert deletes rows older than EXPIRE_AFTER.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from brooq.engine.timer import Every
from brooq.logs import event
from brooq.postgres.registration import PostgresRegistration
from brooq.vocabulary import SchemaMissing

if TYPE_CHECKING:
    from brooq.supervisor.arbiter import Supervisor

log = logging.getLogger("brooq.supervisor")

PERIOD = timedelta(seconds=5)
EXPIRE_AFTER = timedelta(minutes=1)


class Registration:
    """Keeps this supervisor's row current through the database thread."""

    def __init__(self, sup: Supervisor, period: timedelta = PERIOD) -> None:
        self.sup = sup
        self.writer = PostgresRegistration(sup.store.connector)
        self.every = Every(period)
        self.started_at = datetime.now(UTC)
        self.unregistered = False
        self.warned = False

    def run_once(self, now: float) -> None:
        """Submit the upsert when due; once stopping with no worker left, the delete."""
        db = self.sup.db.writes  # never the claims lane: a claim must not wait behind it
        if self.sup.stopping and not self.sup.children:
            if not self.unregistered:
                self.unregistered = True
                db.submit("unregister", self._guarded(self._unregister), self._done)
            return
        if not db.busy("register") and self.every.due(now):
            snapshot, topics = self.workers(), self.topics()
            db.submit(
                "register", self._guarded(lambda: self._register(snapshot, topics)), self._done
            )

    def topics(self) -> list[str]:
        """The topics this supervisor serves now (a reload may change them)."""
        return sorted({t for slot in self.sup.slots for t in slot.topics})

    def workers(self) -> list[dict[str, Any]]:
        """What each worker runs now, taken in the loop's thread."""
        mono, wall = time.monotonic(), time.time()
        out = []
        for child in sorted(self.sup.children.values(), key=lambda c: c.slot):
            job = child.job
            started = (
                datetime.fromtimestamp(wall - (mono - job.started), UTC).isoformat()
                if job
                else None
            )
            out.append(
                {
                    "pid": child.pid,
                    "slot": child.slot,
                    "job_id": job.claimed.id if job else None,
                    "topic": job.claimed.topic if job else None,
                    "started_at": started,
                }
            )
        return out

    def _register(self, workers: list[dict[str, Any]], topics: list[str]) -> None:
        self.writer.register(
            holder=self.sup.holder,
            host=socket.gethostname(),
            pid=os.getpid(),
            app=self.sup.name,
            topics=topics,
            started_at=self.started_at,
            workers=workers,
            expire_after=EXPIRE_AFTER,
        )

    def _unregister(self) -> None:
        self.writer.unregister(self.sup.holder)

    @staticmethod
    def _guarded(call: Any) -> Any:
        def run() -> str | None:
            try:
                call()
            except SchemaMissing as exc:  # new code before `brooq migrate up`: jobs still run
                return str(exc)
            return None

        return run

    def _done(self, missing: str | None, error: BaseException | None) -> None:
        if missing and not self.warned:
            self.warned = True
            event(
                log,
                "RegistrationFailed",
                logging.WARNING,
                error=missing,
                note="`brooq workers` and the dashboard will not list this supervisor",
            )
