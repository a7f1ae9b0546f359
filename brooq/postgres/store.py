"""The PostgreSQL implementation of the Store port: guarded statements from queries.sql."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from brooq.engine.outcome import Outcome, SettleKind, clean_reason
from brooq.engine.port import Claimed, SettleHookFailed, Ticket, TopicCount
from brooq.postgres.connect import Connector
from brooq.postgres.sql import sql
from brooq.vocabulary import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    EnqueueConflict,
    Enqueued,
    Job,
    JobNotFound,
    JobRecord,
    Schedule,
    SettleHook,
    State,
    encode_payload,
    new_job_ids,
    parse_job_id,
)

Row = tuple[Any, ...]
DEADLOCK_RETRIES = 5


class PreparedBatch:
    """Jobs encoded and given ids, ready for one enqueue statement."""

    def __init__(self, jobs: Sequence[Job], max_payload_bytes: int) -> None:
        self.jobs = list(jobs)
        self.ids = new_job_ids(len(self.jobs))
        self.payloads = [encode_payload(j.payload, max_bytes=max_payload_bytes) for j in self.jobs]

    def params_one(self, notify: bool) -> dict[str, Any]:
        """Parameters of ``enqueue_one`` for a batch of one."""
        job = self.jobs[0]
        return {"id": self.ids[0], "topic": job.topic, "payload": self.payloads[0],
                "key": job.idempotency_key, "available_at": job.available_at,
                "priority": job.priority, "notify": notify}

    def params_many(self, notify: bool) -> dict[str, Any]:
        """Parameters of ``enqueue_many``: the jobs as one JSON array (payloads spliced in)."""
        dumps = json.dumps
        rows = [
            f'{{"id":"{job_id}","topic":{dumps(job.topic)},"payload":{payload},'
            f'"key":{dumps(job.idempotency_key)},'
            f'"at":{dumps(job.available_at.isoformat()) if job.available_at else "null"},'
            f'"priority":{job.priority}}}'
            for job_id, job, payload in zip(self.ids, self.jobs, self.payloads, strict=True)
        ]
        return {"jobs": "[" + ",".join(rows) + "]", "notify": notify}

    def statement(self) -> str:
        """The enqueue statement fitting this batch."""
        return sql("enqueue_one") if len(self.jobs) == 1 else sql("enqueue_many")

    def params(self, notify: bool) -> dict[str, Any]:
        """The parameters of :meth:`statement`."""
        return self.params_one(notify) if len(self.jobs) == 1 else self.params_many(notify)

    def missing_keys(self, inserted: set[str]) -> dict[str, list[str]]:
        """The (topic, key) pairs of jobs that were not inserted."""
        topics, keys = [], []
        for job_id, job in zip(self.ids, self.jobs, strict=True):
            if job_id not in inserted and job.idempotency_key is not None:
                topics.append(job.topic)
                keys.append(job.idempotency_key)
        return {"topics": topics, "keys": keys}

    def results(self, inserted: set[str], existing: Iterable[Row]) -> list[Enqueued]:
        """One Enqueued per job, in order: created, or the id of the row that held the key."""
        held = {(topic, key): str(job_id) for topic, key, job_id in existing}
        out = []
        for job_id, job in zip(self.ids, self.jobs, strict=True):
            if job_id in inserted:
                out.append(Enqueued(job_id, True))
            elif (job.topic, job.idempotency_key) in held:
                out.append(Enqueued(held[(job.topic, job.idempotency_key)], False))
            else:
                raise EnqueueConflict(
                    f"idempotency key {job.idempotency_key!r} of topic {job.topic!r} is held by a "
                    "row this transaction cannot see (a concurrent or REPEATABLE READ "
                    "transaction); retry the enqueue in a new transaction"
                )
        return out


def _conflict() -> EnqueueConflict:
    return EnqueueConflict(
        "an idempotency key of this enqueue was taken by a transaction that committed "
        "after yours began (REPEATABLE READ or SERIALIZABLE); retry your whole transaction"
    )


def enqueue_on(
    conn: psycopg.Connection[Any], jobs: Sequence[Job], *, notify: bool = True,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> list[Enqueued]:
    """Enqueue ``jobs`` on ``conn``, inside whatever transaction it has open.

    Nothing is committed here: the jobs become visible when the caller commits
    and vanish if it rolls back.
    """
    if not jobs:
        return []
    batch = PreparedBatch(jobs, max_payload_bytes)
    try:
        inserted = {str(r[0]) for r in conn.execute(batch.statement(), batch.params(notify))}
    except psycopg.errors.SerializationFailure as exc:
        raise _conflict() from exc
    existing: list[Row] = []
    if len(inserted) < len(batch.jobs):
        existing = conn.execute(sql("existing_keys"), batch.missing_keys(inserted)).fetchall()
    return batch.results(inserted, existing)


async def enqueue_on_async(
    aconn: psycopg.AsyncConnection[Any], jobs: Sequence[Job], *, notify: bool = True,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> list[Enqueued]:
    """:func:`enqueue_on` for an asyncio connection."""
    if not jobs:
        return []
    batch = PreparedBatch(jobs, max_payload_bytes)
    try:
        cur = await aconn.execute(batch.statement(), batch.params(notify))
    except psycopg.errors.SerializationFailure as exc:
        raise _conflict() from exc
    inserted = {str(r[0]) for r in await cur.fetchall()}
    existing: list[Row] = []
    if len(inserted) < len(batch.jobs):
        cur = await aconn.execute(sql("existing_keys"), batch.missing_keys(inserted))
        existing = await cur.fetchall()
    return batch.results(inserted, existing)


def _record(row: dict[str, Any]) -> JobRecord:
    return JobRecord(**{**row, "id": str(row["id"]), "state": State(row["state"])})


def _claim_statement(
    holder: str, topics: Sequence[str], lease: timedelta, prefix: str = ""
) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"holder": holder, "lease": lease}
    if len(topics) == 1:
        params["topic"] = topics[0]
        return sql(f"{prefix}claim_topic"), params
    params["topics"] = list(topics)
    return sql(f"{prefix}claim_topics"), params


def _claimed(row: Row | None, holder: str) -> Claimed | None:
    if row is None:
        return None
    job_id, topic, payload, attempts, locked_until = row
    return Claimed(Ticket(str(job_id), holder, attempts), topic, payload, locked_until)


def _settle_params(ticket: Ticket, outcome: Outcome) -> dict[str, Any]:
    return {
        "id": ticket.job_id, "holder": ticket.holder, "attempt": ticket.attempt,
        "state": str(outcome.state), "refund": 1 if outcome.refund_attempt else 0,
        "retry_in": outcome.retry_in or timedelta(0), "error": outcome.error,
    }


def _like_prefix(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def _ticket_arrays(tickets: Sequence[Ticket]) -> dict[str, list[Any]]:
    return {
        "ids": [t.job_id for t in tickets],
        "holders": [t.holder for t in tickets],
        "attempts": [t.attempt for t in tickets],
    }


def _counts(rows: Iterable[Row]) -> list[TopicCount]:
    return [TopicCount(t, n) for t, n in sorted(Counter(r[0] for r in rows).items())]


class PostgresStore:
    """The Store port over PostgreSQL. The only place brooq runs SQL.

    ``source`` is a DSN (one lazily opened connection), a psycopg_pool
    ConnectionPool, or a psycopg Connection. Nothing connects until the first
    operation.
    """

    def __init__(
        self,
        source: str | ConnectionPool | psycopg.Connection[Any],
        *,
        notify: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.connector = Connector(source)
        self._listening: psycopg.Connection[Any] | None = None
        self._turn = False
        self.notify = notify
        self.max_payload_bytes = max_payload_bytes

    def enqueue_many(self, jobs: Sequence[Job], conn: Any = None) -> list[Enqueued]:
        """Insert jobs in one statement; in ``conn``'s open transaction when given."""
        if conn is not None:
            return enqueue_on(conn, jobs, notify=self.notify,
                              max_payload_bytes=self.max_payload_bytes)
        # One statement is atomic on its own: no BEGIN/COMMIT round trips.
        with self.connector.connection() as own:
            return enqueue_on(own, jobs, notify=self.notify,
                              max_payload_bytes=self.max_payload_bytes)

    def claim(
        self, holder: str, topics: Sequence[str], lease: timedelta,
        limits: Mapping[str, int] | None = None,
    ) -> Claimed | None:
        """Take the next ready job of ``topics``: one guarded statement, SKIP LOCKED.

        Topics in ``limits`` (max_running) are claimed one at a time under a
        per-topic transaction lock, so the cap holds across every host.
        """
        caps = limits or {}
        free = [t for t in topics if t not in caps]
        capped = [t for t in topics if t in caps]
        tries: list[Callable[[], Claimed | None]] = [
            lambda: self._claim_free(holder, free, lease) if free else None,
            lambda: self._claim_capped(holder, capped, lease, caps) if capped else None,
        ]
        self._turn = not self._turn  # alternate, so neither group starves the other
        for attempt in tries if self._turn else tries[::-1]:
            claimed = attempt()
            if claimed is not None:
                return claimed
        return None

    def _retrying(self, statement: str, params: dict[str, Any]) -> Row | None:
        """Run one autocommit statement, again if PostgreSQL aborted it for a deadlock.

        Following a row's update chain can wait even under SKIP LOCKED, so two
        settle-and-claims can deadlock; the loser rolled back whole, and the
        fencing guard makes running it again safe.
        """
        with self.connector.connection() as conn:
            for attempt in range(DEADLOCK_RETRIES):
                try:
                    return conn.execute(statement, params).fetchone()
                except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                    if attempt == DEADLOCK_RETRIES - 1:
                        raise
                    time.sleep(0.001 * (attempt + 1))
        return None

    def _claim_free(self, holder: str, topics: Sequence[str], lease: timedelta) -> Claimed | None:
        statement, params = _claim_statement(holder, topics, lease)
        with self.connector.connection() as conn:
            return _claimed(conn.execute(statement, params).fetchone(), holder)

    def _claim_capped(
        self, holder: str, topics: Sequence[str], lease: timedelta, limits: Mapping[str, int]
    ) -> Claimed | None:
        for topic in topics:
            params = {"holder": holder, "lease": lease, "topic": topic,
                      "max_running": limits[topic]}
            with self.connector.connection() as conn, conn.transaction():
                conn.execute(sql("lock_topic"), {"topic": topic})
                row = conn.execute(sql("claim_topic_limited"), params).fetchone()
            if row is not None:
                return _claimed(row, holder)
        return None

    def settle_and_claim(
        self, ticket: Ticket, outcome: Outcome, topics: Sequence[str], lease: timedelta,
    ) -> tuple[bool, Claimed | None]:
        """Settle a plain outcome and claim the next job of ``topics``: one statement, one commit.

        Not for outcomes with chain/hooks (they need the handler's transaction)
        nor for capped topics (they need the topic lock first).
        """
        if outcome.kind is SettleKind.ABANDON:
            return False, self.claim(ticket.holder, topics, lease)
        statement, params = _claim_statement(ticket.holder, topics, lease, prefix="settle_and_")
        params.update(_settle_params(ticket, outcome))
        row = self._retrying(statement, params)
        assert row is not None
        return row[0] == 1, _claimed(row[1:] if row[1] is not None else None, ticket.holder)

    def settle(
        self,
        ticket: Ticket,
        outcome: Outcome,
        chain: Sequence[Job] = (),
        hooks: Sequence[SettleHook] = (),
    ) -> bool:
        """Write the outcome if the ticket still holds the job; chain and hooks in the same tx."""
        if outcome.kind is SettleKind.ABANDON:
            return False
        params = _settle_params(ticket, outcome)
        with_effects = outcome.kind is SettleKind.DONE and (chain or hooks)
        with self.connector.connection() as conn:
            if not with_effects:
                return conn.execute(sql("settle"), params).rowcount == 1
            with conn.transaction():
                if conn.execute(sql("settle"), params).rowcount != 1:
                    return False
                self._run_effects(conn, chain, hooks)
            return True

    def _run_effects(
        self, conn: psycopg.Connection[Any], chain: Sequence[Job], hooks: Sequence[SettleHook]
    ) -> None:
        try:
            if chain:
                enqueue_on(conn, chain, notify=self.notify,
                           max_payload_bytes=self.max_payload_bytes)
            for hook in hooks:
                hook(conn)
        except psycopg.OperationalError as exc:
            if conn.broken or conn.closed:
                raise  # the connection itself failed: StoreUnavailable, nothing written
            # A statement timeout, deadlock or lock timeout in a hook is the hook's
            # failure, recorded like any other; never a lease-expiry retry loop.
            raise SettleHookFailed(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            raise SettleHookFailed(f"{type(exc).__name__}: {exc}") from exc

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        """Extend every lease still held, in one statement; return the ids extended."""
        if not tickets:
            return set()
        params = {"lease": lease, **_ticket_arrays(tickets)}
        with self.connector.connection() as conn:
            return {str(r[0]) for r in conn.execute(sql("heartbeat"), params)}

    def release(self, tickets: Sequence[Ticket]) -> set[str]:
        """Return held jobs to ``pending`` and give back the attempt; ids released."""
        if not tickets:
            return set()
        with self.connector.connection() as conn:
            return {str(r[0]) for r in conn.execute(sql("release"), _ticket_arrays(tickets))}

    def requeue_expired(self) -> list[TopicCount]:
        """The reaper's one statement: expired leases back to pending, attempts untouched."""
        with self.connector.connection() as conn:
            return _counts(conn.execute(sql("requeue_expired")).fetchall())

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[TopicCount]:
        """Delete one batch of terminal rows older than ``ttl`` in its own transaction."""
        if ttl <= timedelta(0):
            raise ValueError("retention TTL must be positive; 0 disables retention")
        with self.connector.connection() as conn, conn.transaction():
            rows = conn.execute(sql("delete_terminal"), {"ttl": ttl, "batch": batch}).fetchall()
        return _counts(rows)

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a non-terminal job (NOTIFY brooq_cancel); False when already terminal."""
        key = self._key(job_id)
        if reason is not None:
            reason = clean_reason(reason)
        with self.connector.connection() as conn:
            if conn.execute(sql("cancel"), {"id": key, "reason": reason}).fetchone():
                return True
        self.get(key)  # raises JobNotFound for an unknown id
        return False

    def get(self, job_id: str) -> JobRecord:
        """The job's row; JobNotFound when there is none."""
        key = self._key(job_id)
        with self.connector.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = cur.execute(sql("get"), {"id": key}).fetchone()
        if row is None:
            raise JobNotFound(f"no job with id {key}")
        return _record(row)

    def depth(self) -> list[dict[str, Any]]:
        """Rows per topic and state: ``{"topic", "state", "jobs"}``."""
        with self.connector.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return cur.execute(sql("depth")).fetchall()

    def oldest_ready(self) -> dict[str, float]:
        """Seconds the oldest ready job of each topic has waited; topics with none are absent."""
        with self.connector.connection() as conn:
            return {t: float(s) for t, s in conn.execute(sql("oldest_ready"))}

    def gauges(
        self, timeout: timedelta,
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """:meth:`depth` and :meth:`oldest_ready` in one transaction, each bounded by ``timeout``.

        A cold scrape of a huge (or locked) table fails with StoreUnavailable
        after ``timeout`` instead of holding an HTTP request and a connection.
        """
        ms = max(1, round(timeout.total_seconds() * 1000))
        with self.connector.connection() as conn, conn.transaction():
            conn.execute(sql("local_statement_timeout"), {"timeout": f"{ms}ms"})
            cur = conn.cursor(row_factory=dict_row)
            depth = cur.execute(sql("depth")).fetchall()
            oldest = {t: float(s) for t, s in conn.execute(sql("oldest_ready"))}
        return depth, oldest

    def running(self) -> list[dict[str, Any]]:
        """Jobs in flight with holder and seconds of lease left."""
        with self.connector.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return cur.execute(sql("running")).fetchall()

    def recent_dead(self, since: timedelta, limit: int = 20) -> list[dict[str, Any]]:
        """Jobs that went dead within ``since``, newest first."""
        with self.connector.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return cur.execute(sql("recent_dead"), {"since": since, "limit": limit}).fetchall()

    def last_scheduled_run(self, schedule: Schedule) -> datetime | None:
        """When the latest run of ``schedule`` still in the table was due."""
        params = {"topic": schedule.topic,
                  "key_prefix": _like_prefix(schedule.key_prefix)}
        with self.connector.connection() as conn:
            row = conn.execute(sql("last_scheduled_run"), params).fetchone()
        return row[0] if row else None

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers."""
        with self.connector.connection() as conn:
            conn.execute("SELECT 1")

    def wait_for_jobs(self, timeout: float) -> None:
        """Wait up to ``timeout`` s on this store's connection for an enqueue NOTIFY.

        Notifications that arrived while the connection ran other statements
        end the wait at once, so no wake-up is lost between two waits.
        """
        with self.connector.connection() as conn:
            if self._listening is not conn:
                conn.execute("LISTEN brooq_job")
                self._listening = conn
            for _ in conn.notifies(timeout=timeout, stop_after=1):
                pass

    @staticmethod
    def _key(job_id: str) -> str:
        try:
            return parse_job_id(job_id)
        except ValueError as exc:
            raise JobNotFound(str(exc)) from None

    def close(self) -> None:
        """Close the connection the store opened itself."""
        self.connector.close()
