"""The PostgreSQL implementation of the Store port: guarded statements from queries.sql."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeGuard

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from brooq.engine.outcome import Outcome, SettleKind, clean_reason
from brooq.engine.store import Claimed, Requeued, SettleHookFailed, Ticket, TopicCount
from brooq.postgres.connect import Connector, Source
from brooq.postgres.dsn import dsn_passwords, scrub
from brooq.postgres.enqueue import enqueue_on, enqueue_on_async
from brooq.postgres.sql import sql
from brooq.vocabulary import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Enqueued,
    Job,
    JobNotFound,
    JobRecord,
    Schedule,
    SettleHook,
    State,
    decode_stored_payload,
    parse_job_id,
)

Row = tuple[Any, ...]
DEADLOCK_RETRIES = 5


def record(row: Mapping[str, Any]) -> JobRecord:
    """A JobRecord from a row of the ``get`` statement (its payload still JSON text)."""
    payload, error = decode_stored_payload(row["payload"])
    return JobRecord(
        **{
            **row,
            "id": str(row["id"]),
            "state": State(row["state"]),
            "payload": payload,
            "payload_error": error,
        }
    )


def _claimed(rows: Iterable[Row], holder: str) -> list[Claimed]:
    # RETURNING does not keep the ORDER BY of the subquery: restore the claim order.
    ordered = sorted(rows, key=lambda r: (-r[6], r[7], str(r[0])))
    return [
        Claimed(
            Ticket(str(job_id), holder, attempts),
            topic,
            payload,
            locked_until,
            expirations,
            priority,
            available_at,
        )
        for (
            job_id,
            topic,
            payload,
            attempts,
            expirations,
            locked_until,
            priority,
            available_at,
        ) in ordered
    ]


def _secrets_of(source: str | ConnectionPool | psycopg.Connection[Any]) -> list[str]:
    """The password(s) a store's own error texts must never carry."""
    if isinstance(source, str):
        return dsn_passwords(source)
    if isinstance(source, ConnectionPool):
        conninfo = source.conninfo  # may be a callable, which we do not call
        return dsn_passwords(conninfo) if isinstance(conninfo, str) else []
    try:
        password = source.info.password
    except psycopg.Error:
        return []
    return [password] if password else []


def _hidden(outcome: Outcome, secrets: Sequence[str]) -> Outcome:
    """``outcome`` with DSN passwords hidden in its error and traceback: a handler that
    failed to connect somewhere often quotes the DSN, password and all."""
    if outcome.error is None and outcome.traceback is None:
        return outcome
    return replace(
        outcome,
        error=outcome.error and scrub(outcome.error, secrets),
        traceback=outcome.traceback and scrub(outcome.traceback, secrets),
    )


def _settle_params(ticket: Ticket, outcome: Outcome) -> dict[str, Any]:
    return {
        "id": ticket.job_id,
        "holder": ticket.holder,
        "attempt": ticket.attempt,
        "state": str(outcome.state),
        "refund": 1 if outcome.refund_attempt else 0,
        "retry_in": outcome.retry_in or timedelta(0),
        "error": outcome.error,
        "traceback": outcome.traceback,
    }


def _outcomes_json(settles: Sequence[tuple[Ticket, Outcome]]) -> str:
    """The outcomes of ``settle_many`` as one JSON array (PostgreSQL parses it fast)."""
    return json.dumps(
        [
            {
                "id": t.job_id,
                "holder": t.holder,
                "attempt": t.attempt,
                "state": str(o.state),
                "refund": 1 if o.refund_attempt else 0,
                "retry_s": (o.retry_in or timedelta(0)).total_seconds(),
                "error": o.error,
                "traceback": o.traceback,
            }
            for t, o in sorted(settles, key=lambda s: s[0].job_id)  # one lock order: no deadlock
            if o.kind is not SettleKind.ABANDON
        ],
        ensure_ascii=False,
    )


def _like_prefix(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def _ticket_arrays(tickets: Sequence[Ticket]) -> dict[str, list[Any]]:
    return {
        "ids": [t.job_id for t in tickets],
        "holders": [t.holder for t in tickets],
        "attempts": [t.attempt for t in tickets],
    }


def _counts(topics: Iterable[str]) -> list[TopicCount]:
    return [TopicCount(t, n) for t, n in sorted(Counter(topics).items())]


class PostgresStore:
    """The Store port over PostgreSQL. The only place brooq writes jobs with SQL.

    ``source`` is a DSN (one lazily opened connection), a psycopg_pool
    ConnectionPool, or a psycopg Connection. Nothing connects until the first
    operation. ``statement_timeout`` (DSN only) bounds every statement of the
    store's own connection on the server side.
    """

    def __init__(
        self,
        source: str | ConnectionPool | psycopg.Connection[Any],
        *,
        notify: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        statement_timeout: timedelta | None = None,
        prepare: bool = True,
    ) -> None:
        self.connector = Connector(Source(source, statement_timeout, prepare))
        self._secrets = _secrets_of(source)
        self._turn = False
        self.notify = notify
        self.max_payload_bytes = max_payload_bytes

    def enqueue_many(self, jobs: Sequence[Job], conn: Any = None) -> list[Enqueued]:
        """Insert jobs in one statement; in ``conn``'s open transaction when given."""
        if conn is not None:
            return enqueue_on(
                conn, jobs, notify=self.notify, max_payload_bytes=self.max_payload_bytes
            )
        # One statement is atomic on its own: no BEGIN/COMMIT round trips.
        with self.connector.connection() as own:
            return enqueue_on(
                own, jobs, notify=self.notify, max_payload_bytes=self.max_payload_bytes
            )

    async def enqueue_many_async(self, jobs: Sequence[Job], conn: Any) -> list[Enqueued]:
        """Insert jobs on an asyncio connection, in its open transaction."""
        return await enqueue_on_async(
            conn, jobs, notify=self.notify, max_payload_bytes=self.max_payload_bytes
        )

    def claim(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limits: Mapping[str, int] | None = None,
    ) -> Claimed | None:
        """Take the next ready job of ``topics`` (see claim_many)."""
        claimed = self.claim_many(holder, topics, lease, 1, limits)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limit: int,
        limits: Mapping[str, int] | None = None,
    ) -> list[Claimed]:
        """Take up to ``limit`` ready jobs of ``topics``: one guarded statement, SKIP LOCKED.

        Topics in ``limits`` (max_running) are claimed under a per-topic
        transaction lock, so the cap holds across every host. Free and capped
        topics take turns to go first, so neither group starves the other.
        """
        caps = limits or {}
        free = [t for t in topics if t not in caps]
        capped = [t for t in topics if t in caps]
        self._turn = not self._turn
        out: list[Claimed] = []
        for group in [free, capped] if self._turn else [capped, free]:
            if group and len(out) < limit:
                take = limit - len(out)
                got = (
                    self._claim_capped(holder, group, lease, take, caps)
                    if group is capped
                    else self._claim_free(holder, group, lease, take)
                )
                out.extend(got)
        return out

    def _claim_free(
        self, holder: str, topics: Sequence[str], lease: timedelta, limit: int
    ) -> list[Claimed]:
        params: dict[str, Any] = {"holder": holder, "lease": lease, "limit": limit}
        if len(topics) == 1:
            statement, params["topic"] = sql("claim_topic"), topics[0]
        else:
            statement, params["topics"] = sql("claim_topics"), list(topics)
        with self.connector.connection() as conn:
            return _claimed(conn.execute(statement, params).fetchall(), holder)

    def _claim_capped(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limit: int,
        limits: Mapping[str, int],
    ) -> list[Claimed]:
        out: list[Claimed] = []
        for topic in topics:
            if len(out) >= limit:
                break
            params = {
                "holder": holder,
                "lease": lease,
                "topic": topic,
                "limit": limit - len(out),
                "max_running": limits[topic],
            }
            with self.connector.connection() as conn, conn.transaction():
                conn.execute(sql("lock_topic"), {"topic": topic})
                out.extend(_claimed(conn.execute(sql("claim_topic_limited"), params), holder))
        return out

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
        params = _settle_params(ticket, _hidden(outcome, self._secrets))
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
                enqueue_on(
                    conn, chain, notify=self.notify, max_payload_bytes=self.max_payload_bytes
                )
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

    def settle_many(self, settles: Sequence[tuple[Ticket, Outcome]]) -> set[str]:
        """Write plain outcomes in one statement; the ids written (others lost their lease).

        PostgreSQL may abort the statement for a deadlock (another supervisor's
        reaper updating the same rows in another order); it rolled back whole
        and the fence makes running it again safe.
        """
        outcomes = _outcomes_json([(t, _hidden(o, self._secrets)) for t, o in settles])
        if outcomes == "[]":
            return set()
        rows = self._retrying(sql("settle_many"), {"outcomes": outcomes})
        return {str(r[0]) for r in rows}

    def _retrying(self, statement: str, params: dict[str, Any]) -> list[Row]:
        with self.connector.connection() as conn:
            # Inside a transaction (through PgBouncer the connector opens one per operation
            # for its SET LOCAL), each try is a savepoint, so a deadlock victim can retry.
            nested = conn.info.transaction_status != TransactionStatus.IDLE
            for attempt in range(DEADLOCK_RETRIES):
                try:
                    with conn.transaction() if nested else contextlib.nullcontext():
                        return conn.execute(statement, params).fetchall()
                except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                    if attempt == DEADLOCK_RETRIES - 1:
                        raise
                    time.sleep(0.001 * (attempt + 1))
        return []

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        """Extend every lease still held, in one statement; return the ids extended."""
        if not tickets:
            return set()
        params = {"lease": lease, **_ticket_arrays(sorted(tickets))}
        return {str(r[0]) for r in self._retrying(sql("heartbeat"), params)}

    def release(self, tickets: Sequence[Ticket]) -> set[str]:
        """Return held jobs to ``pending`` and give back the attempt; ids released."""
        if not tickets:
            return set()
        params = _ticket_arrays(sorted(tickets))
        return {str(r[0]) for r in self._retrying(sql("release"), params)}

    def release_unknown(self, holder: str, known: Sequence[str]) -> set[str]:
        """Give back, uncharged, the rows ``holder`` holds that are not in ``known``."""
        params = {"holder": holder, "known": list(known)}
        return {str(r[0]) for r in self._retrying(sql("release_unknown"), params)}

    def requeue_expired(self, max_expirations: int = 0, batch: int = 1000) -> Requeued:
        """The reaper's one statement: at most ``batch`` expired leases, attempts untouched."""
        params = {"max_expirations": max_expirations, "batch": batch}
        rows = self._retrying(sql("requeue_expired"), params)
        return Requeued(
            _counts(t for t, s in rows if s == "pending"),
            _counts(t for t, s in rows if s == "dead"),
        )

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[TopicCount]:
        """Delete one batch of terminal rows older than ``ttl`` in its own transaction."""
        if ttl <= timedelta(0):
            raise ValueError("retention TTL must be positive; 0 disables retention")
        with self.connector.connection() as conn, conn.transaction():
            rows = conn.execute(sql("delete_terminal"), {"ttl": ttl, "batch": batch}).fetchall()
        return _counts(r[0] for r in rows)

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
        return record(row)

    def last_scheduled_run(self, schedule: Schedule) -> datetime | None:
        """When the latest run of ``schedule`` still in the table was due."""
        params = {"topic": schedule.topic, "key_prefix": _like_prefix(schedule.key_prefix)}
        with self.connector.connection() as conn:
            row = conn.execute(sql("last_scheduled_run"), params).fetchone()
        return row[0] if row else None

    @staticmethod
    def _key(job_id: str) -> str:
        try:
            return parse_job_id(job_id)
        except ValueError as exc:
            raise JobNotFound(str(exc)) from None

    def close(self) -> None:
        """Close the connection the store opened itself."""
        self.connector.close()


def is_database_source(
    source: object,
) -> TypeGuard[str | ConnectionPool | psycopg.Connection[Any]]:
    """True for what :class:`PostgresStore` connects with: a DSN, a pool or a connection."""
    return isinstance(source, str | ConnectionPool | psycopg.Connection)
