"""The supervisor's row in ``brooq_supervisor``: who is alive against this database, doing what.

Every PERIOD the loop takes a snapshot of its workers (pid, slot, current
job, topic, since when) and hands one upsert to the writes lane; the loop
never waits for it. At a clean stop, once the last worker is gone, the row
is deleted. A supervisor killed without a clean stop leaves its row:
readers count it dead once ``seen_at`` is older than 3 × PERIOD, and every
supervisor's upsert deletes rows older than EXPIRE_AFTER.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from brooq.engine.timer import Every
from brooq.logs import event
from brooq.supervisor.children import ChildProcess
from brooq.supervisor.database import Database
from brooq.vocabulary import PrivilegeMissing, SchemaMissing

log = logging.getLogger("brooq.supervisor")

PERIOD = timedelta(seconds=5)
EXPIRE_AFTER = timedelta(minutes=1)


class RegistrationWriter(Protocol):
    """Where the row is written (brooq.postgres.registration.PostgresRegistration)."""

    def register(
        self,
        *,
        holder: str,
        host: str,
        pid: int,
        app: str,
        topics: Sequence[str],
        started_at: datetime,
        workers: Sequence[dict[str, Any]],
        expire_after: timedelta,
        app_version: str | None = None,
    ) -> None:
        """Upsert the supervisor's row (with its app version, None: unversioned); delete rows
        dead for longer than ``expire_after``."""

    def unregister(self, holder: str) -> None:
        """Delete the supervisor's row."""


def worker_rows(children: Iterable[ChildProcess], mono: float, wall: float) -> list[dict[str, Any]]:
    """What each worker runs now, by slot; ``mono`` and ``wall`` are the same moment on the
    monotonic and the wall clock (a job's start is known on the first, shown on the second)."""
    out = []
    for child in sorted(children, key=lambda c: c.slot):
        job = child.job
        started = (
            datetime.fromtimestamp(wall - (mono - (job.started or mono)), UTC).isoformat()
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


class Registration:
    """Keeps this supervisor's row current through the writes lane."""

    def __init__(
        self,
        writer: RegistrationWriter,
        writes: Database,
        *,
        holder: str,
        app: str,
        period: timedelta = PERIOD,
        wall_clock: Callable[[], float] = time.time,
        app_version: str | None = None,
    ) -> None:
        self.app_version = app_version
        # Never the claims lane: a claim must not wait behind a registration.
        self.writer, self.writes = writer, writes
        self.holder, self.app = holder, app
        self.every = Every(period)
        self.wall_clock = wall_clock
        self.started_at = datetime.fromtimestamp(wall_clock(), UTC)
        self.unregistered = False
        self.warned = False

    def run_once(
        self,
        now: float,
        *,
        workers: Sequence[ChildProcess],
        topics: Sequence[str],
        stopping: bool,
    ) -> str | None:
        """Submit the upsert when due; once stopping with no worker left, the delete.

        ``workers`` are the live worker processes, ``topics`` what this
        supervisor serves now (a reload may change them). The task submitted.
        """
        if stopping and not workers:
            if self.unregistered:
                return None
            self.unregistered = True
            self.writes.submit("unregister", self._guarded(self._unregister), self._done)
            return "unregister"
        if self.writes.busy("register") or not self.every.due(now):
            return None
        rows, served = worker_rows(workers, now, self.wall_clock()), sorted(topics)
        self.writes.submit(
            "register", self._guarded(lambda: self._register(rows, served)), self._done
        )
        return "register"

    def _register(self, workers: list[dict[str, Any]], topics: list[str]) -> None:
        self.writer.register(
            holder=self.holder,
            host=socket.gethostname(),
            pid=os.getpid(),
            app=self.app,
            topics=topics,
            started_at=self.started_at,
            workers=workers,
            expire_after=EXPIRE_AFTER,
            app_version=self.app_version,
        )

    def _unregister(self) -> None:
        self.writer.unregister(self.holder)

    @staticmethod
    def _guarded(call: Callable[[], None]) -> Callable[[], str | None]:
        def run() -> str | None:
            try:
                call()
            except (SchemaMissing, PrivilegeMissing) as exc:
                # New code before `brooq migrate up`, or a grant revoked while it runs:
                # jobs still run; say it once, not every PERIOD.
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
