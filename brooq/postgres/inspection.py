"""The Inspection port over PostgreSQL: operators' reads, each under a statement time limit."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from brooq.engine.filters import Cursor, JobFilter
from brooq.engine.inspection import (
    DeadJob,
    Family,
    JobPage,
    JobRow,
    MinuteCount,
    PartitionRow,
    RunningJob,
    SkippedRow,
    SupervisorRow,
    SupervisorRows,
    TopicRate,
    TopicStateCount,
    VersionCount,
    WorkerSnapshot,
)
from brooq.postgres.connect import Connector, Source
from brooq.postgres.rows import record
from brooq.postgres.sql import sql
from brooq.postgres.workflows import FAMILY_LIMIT, family_of
from brooq.vocabulary import JobNotFound, JobRecord, TopicPause, parse_job_id

READ_TIMEOUT = timedelta(seconds=5)
SUPERVISOR_ALIVE_WITHIN = timedelta(seconds=15)
"""A supervisor registers every 5 s: three missed beats and it counts as dead."""


class PostgresInspection:
    """Read-only views of the ``job`` table, on a connection of their own.

    Each read runs in a short transaction whose statements PostgreSQL stops
    after ``timeout``: a cold scrape of a huge table answers late or not at
    all, but never holds its caller (a supervisor's HTTP thread) for long.
    """

    def __init__(
        self,
        source: str | ConnectionPool | psycopg.Connection[Any] | Connector,
        timeout: timedelta | Callable[[], timedelta] = READ_TIMEOUT,
        prepare: bool = True,
    ) -> None:
        self.connector = (
            source if isinstance(source, Connector) else Connector(Source(source, prepare=prepare))
        )
        self.timeout = timeout
        """The time limit of each read, or a callable that says it at each read (what is
        left of a caller's deadline: a dashboard page bounds all of its reads together)."""

    @contextmanager
    def _reading(self) -> Iterator[psycopg.Cursor[dict[str, Any]]]:
        timeout = self.timeout() if callable(self.timeout) else self.timeout
        ms = f"{max(1, int(timeout.total_seconds() * 1000))}ms"
        with self.connector.connection() as conn, conn.transaction():
            conn.execute(sql("limit_statement_time"), {"timeout": ms})
            yield conn.cursor(row_factory=dict_row)

    def depth(self) -> list[TopicStateCount]:
        """Rows per topic and state."""
        with self._reading() as cur:
            return [TopicStateCount(**row) for row in cur.execute(sql("depth"))]

    def oldest_ready(self) -> dict[str, float]:
        """Seconds the oldest ready job of each topic has waited; topics with none are absent."""
        with self._reading() as cur:
            rows = cur.execute(sql("oldest_ready"))
            return {r["topic"]: float(r["oldest_ready_s"]) for r in rows}

    def running(self) -> list[RunningJob]:
        """Jobs in flight with holder and seconds of lease left."""
        with self._reading() as cur:
            return [
                RunningJob(
                    **{**row, "id": str(row["id"]), "lease_left_s": _seconds(row["lease_left_s"])}
                )
                for row in cur.execute(sql("running"))
            ]

    def recent_dead(self, since: timedelta, limit: int = 20) -> list[DeadJob]:
        """Jobs that went dead within ``since``, newest first."""
        with self._reading() as cur:
            rows = cur.execute(sql("recent_dead"), {"since": since, "limit": limit})
            return [DeadJob(**{**row, "id": str(row["id"])}) for row in rows]

    def count_dead(self, since: timedelta) -> int:
        """How many jobs went dead within ``since``."""
        with self._reading() as cur:
            row = cur.execute(sql("count_dead"), {"since": since}).fetchone()
        return int(row["dead"]) if row else 0

    def pauses(self) -> list[TopicPause]:
        """Every paused topic in brooq_topic_pause, by name."""
        with self._reading() as cur:
            return [
                TopicPause(r["topic"], r["reason"], r["paused_at"], r["paused_by"])
                for r in cur.execute(sql("topic_pauses"))
            ]

    def pending_by_version(self) -> list[VersionCount]:
        """Jobs not started yet (waiting, pending, failed) per topic and app version."""
        with self._reading() as cur:
            return [VersionCount(**r) for r in cur.execute(sql("pending_by_version"))]

    def rate_limits(self) -> list[TopicRate]:
        """Every rate-limited topic recorded in brooq_rate_limit, and its tokens now."""
        with self._reading() as cur:
            return [
                TopicRate(
                    topic=r["topic"],
                    limit=rate_text(r["rate"], r["per_s"]),
                    burst=r["burst"],
                    tokens=round(r["tokens"], 3),
                    keys=r["keys"],
                    keys_waiting=r["keys_waiting"],
                )
                for r in cur.execute(sql("rate_limits"))
            ]

    def job(self, job_id: str) -> JobRecord:
        """One job's whole row; JobNotFound when there is none."""
        try:
            key = parse_job_id(job_id)
        except ValueError:
            raise JobNotFound(f"no job with id {job_id!r}") from None
        with self._reading() as cur:
            row = cur.execute(sql("get"), {"id": key}).fetchone()
        if row is None:
            raise JobNotFound(f"no job with id {key}")
        return record(row)

    def family(self, job_id: str, limit: int = FAMILY_LIMIT) -> Family:
        """A job's parents and children with their states, at most ``limit`` of each."""
        try:
            key = parse_job_id(job_id)
        except ValueError:
            raise JobNotFound(f"no job with id {job_id!r}") from None
        with self._reading() as cur:
            rows = cur.execute(sql("family"), {"id": key, "limit": limit}).fetchall()
        return family_of([(r["side"], r["id"], r["state"], r["total"]) for r in rows])

    def list_jobs(self, where: JobFilter) -> JobPage:
        """One page of the jobs ``where`` matches, newest ``updated_at`` first."""
        size = where.page_size
        params = {
            **where.params(),
            "limit": size + 1,
            "after_at": where.after.updated_at if where.after else None,
            "after_id": where.after.id if where.after else None,
        }
        with self._reading() as cur:
            rows = [
                JobRow(**{**r, "id": str(r["id"])}) for r in cur.execute(sql("list_jobs"), params)
            ]
        more = len(rows) > size
        rows = rows[:size]
        return JobPage(rows, Cursor(rows[-1].updated_at, rows[-1].id) if more else None)

    def count_jobs(self, where: JobFilter) -> int:
        """How many jobs ``where`` matches."""
        with self._reading() as cur:
            row = cur.execute(sql("count_jobs"), where.params()).fetchone()
        return int(row["jobs"]) if row else 0

    def supervisors(
        self,
        alive_within: timedelta = SUPERVISOR_ALIVE_WITHIN,
    ) -> list[SupervisorRow]:
        """Every registered supervisor whose row can be read, live ones first."""
        return self.supervisor_rows(alive_within).rows

    def supervisor_rows(
        self,
        alive_within: timedelta = SUPERVISOR_ALIVE_WITHIN,
    ) -> SupervisorRows:
        """The readable rows of ``brooq_supervisor``, and the others named with why."""
        with self._reading() as cur:
            found = cur.execute(sql("supervisors"), {"alive_within": alive_within}).fetchall()
        rows, skipped = [], []
        for row in found:
            try:
                rows.append(supervisor_row(row))
            except UnreadableRow as exc:
                skipped.append(SkippedRow(str(row["holder"]), str(exc)))
        return SupervisorRows(rows, skipped)

    def throughput(self, since: timedelta) -> list[MinuteCount]:
        """Jobs done and dead per minute within ``since``, oldest first."""
        with self._reading() as cur:
            return [MinuteCount(**r) for r in cur.execute(sql("throughput"), {"since": since})]

    def partitions(self) -> list[PartitionRow]:
        """Every partition of job, oldest range first, the default one last (catalog reads)."""
        with self._reading() as cur:
            return [
                PartitionRow(
                    name=r["name"],
                    starts=r["starts"],
                    ends=r["ends"],
                    default=r["is_default"],
                    rows=int(r["rows"]),
                    bytes=int(r["bytes"]),
                )
                for r in cur.execute(sql("partitions"))
            ]

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers."""
        with self.connector.connection() as conn:
            conn.execute(sql("ping"))

    def close(self) -> None:
        """Close the connection this inspection opened."""
        self.connector.close()


def rate_text(rate: int, per_s: float) -> str:
    """``20/s`` from a bucket's rate and interval (seconds)."""
    unit = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(per_s)
    return f"{rate}/{unit}" if unit else f"{rate}/{per_s:g}s"


def _seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


class UnreadableRow(ValueError):
    """A row of ``brooq_supervisor`` holds what no supervisor writes; str() says what."""


def supervisor_row(row: dict[str, Any]) -> SupervisorRow:
    """A SupervisorRow from a row of the ``supervisors`` statement; UnreadableRow for a row
    that holds what no supervisor writes (an infinite time, workers that are not workers)."""
    for name in ("started_at", "seen_at"):
        if row[name] is None:
            raise UnreadableRow(f"{name} is {row[name + '_text']}")
    topics = row["topics"] or []
    if not all(isinstance(t, str) for t in topics):
        raise UnreadableRow("topics holds a null")
    try:
        workers = tuple(_worker(w) for w in _json_list(row["workers"]))
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError):
        raise UnreadableRow("workers is not a list of workers") from None
    return SupervisorRow(
        holder=row["holder"],
        host=row["host"],
        pid=row["pid"],
        app=row["app"],
        topics=tuple(topics),
        started_at=row["started_at"],
        seen_at=row["seen_at"],
        workers=workers,
        alive=bool(row["alive"]),
        app_version=row.get("app_version"),
    )


def _json_list(text: str | list[Any] | None) -> list[Any]:
    value = json.loads(text) if isinstance(text, str) else text
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError("not a list")
    return value


def _worker(w: dict[str, Any]) -> WorkerSnapshot:
    job_id, topic, started = w.get("job_id"), w.get("topic"), w.get("started_at")
    if not all(v is None or isinstance(v, str) for v in (job_id, topic, started)):
        raise TypeError("a worker's job_id, topic and started_at are texts")
    pid, slot = w["pid"], w["slot"]
    if not (type(pid) is int and type(slot) is int):
        raise TypeError("a worker's pid and slot are integers")
    at = datetime.fromisoformat(started) if started else None
    if at is not None and at.tzinfo is None:
        raise ValueError("a worker's started_at has no time zone")
    return WorkerSnapshot(pid=pid, slot=slot, job_id=job_id, topic=topic, started_at=at)
