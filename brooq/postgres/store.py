"""The PostgreSQL implementation of the Store port: guarded statements from queries.sql."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeGuard

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from brooq.engine.outcome import Outcome, SettleKind, clean_reason
from brooq.engine.store import (
    Claimed,
    ClaimedBatch,
    Requeued,
    SettleHookFailed,
    Ticket,
    TopicCount,
)
from brooq.postgres.connect import Connector, Source
from brooq.postgres.enqueue import enqueue_on, enqueue_on_async
from brooq.postgres.limited import claim_limited
from brooq.postgres.rows import (
    Row,
    claimed_rows,
    hidden,
    like_prefix,
    outcomes_json,
    passwords_of,
    record,
    settle_params,
    ticket_arrays,
    topic_counts,
)
from brooq.postgres.sql import sql
from brooq.vocabulary import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Enqueued,
    Job,
    JobNotFound,
    JobRecord,
    RateLimit,
    Schedule,
    SettleHook,
    parse_job_id,
)

__all__ = ["PostgresStore", "is_database_source"]

DEADLOCK_RETRIES = 5


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
        self._secrets = passwords_of(source)
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
        rates: Mapping[str, RateLimit] | None = None,
    ) -> Claimed | None:
        """Take the next ready job of ``topics`` (see claim_many)."""
        claimed = self.claim_many(holder, topics, lease, 1, limits, rates)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limit: int,
        limits: Mapping[str, int] | None = None,
        rates: Mapping[str, RateLimit] | None = None,
    ) -> ClaimedBatch:
        """Take up to ``limit`` ready jobs of ``topics``: one guarded statement, SKIP LOCKED.

        Topics in ``limits`` (max_running) or ``rates`` (rate_limit) are
        claimed under a per-topic transaction lock, so the cap and the rate
        hold across every host. Free and limited topics take turns to go
        first, so neither group starves the other.
        """
        caps, rated = limits or {}, rates or {}
        free = [t for t in topics if t not in caps and t not in rated]
        capped = [t for t in topics if t in caps or t in rated]
        self._turn = not self._turn
        out = ClaimedBatch()
        for group in [free, capped] if self._turn else [capped, free]:
            if group and len(out) < limit:
                take = limit - len(out)
                if group is capped:
                    self._claim_capped(out, holder, group, lease, take, caps, rated)
                else:
                    out.extend(self._claim_free(holder, group, lease, take))
        if len(out) >= limit:
            out.rate_limited.clear()  # not cut short: whatever waits is for the next claim
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
            return claimed_rows(conn.execute(statement, params).fetchall(), holder)

    def _claim_capped(
        self,
        out: ClaimedBatch,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limit: int,
        limits: Mapping[str, int],
        rates: Mapping[str, RateLimit],
    ) -> None:
        wanted = len(out) + limit
        for topic in topics:
            if len(out) >= wanted:
                break
            claimed, wait = claim_limited(
                self.connector,
                holder,
                topic,
                lease,
                wanted - len(out),
                limits.get(topic),
                rates.get(topic),
            )
            out.extend(claimed)
            if wait is not None:
                out.rate_limited[topic] = wait

    def declare_rates(self, rates: Mapping[str, RateLimit]) -> None:
        """Record each topic's rate limit in its bucket (created full), tokens untouched."""
        if not rates:
            return
        topics = sorted(rates)
        params = {
            "topics": topics,
            "rates": [rates[t].count for t in topics],
            "pers": [rates[t].per for t in topics],
            "bursts": [rates[t].burst for t in topics],
        }
        self._retrying(sql("declare_rates"), params, fetch=False)

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
        params = settle_params(ticket, hidden(outcome, self._secrets))
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
        outcomes = outcomes_json([(t, hidden(o, self._secrets)) for t, o in settles])
        if outcomes == "[]":
            return set()
        rows = self._retrying(sql("settle_many"), {"outcomes": outcomes})
        return {str(r[0]) for r in rows}

    def _retrying(self, statement: str, params: dict[str, Any], fetch: bool = True) -> list[Row]:
        with self.connector.connection() as conn:
            # Inside a transaction (through PgBouncer the connector opens one per operation
            # for its SET LOCAL), each try is a savepoint, so a deadlock victim can retry.
            nested = conn.info.transaction_status != TransactionStatus.IDLE
            for attempt in range(DEADLOCK_RETRIES):
                try:
                    with conn.transaction() if nested else contextlib.nullcontext():
                        cur = conn.execute(statement, params)
                        return cur.fetchall() if fetch else []
                except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                    if attempt == DEADLOCK_RETRIES - 1:
                        raise
                    time.sleep(0.001 * (attempt + 1))
        return []

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        """Extend every lease still held, in one statement; return the ids extended."""
        if not tickets:
            return set()
        params = {"lease": lease, **ticket_arrays(sorted(tickets))}
        return {str(r[0]) for r in self._retrying(sql("heartbeat"), params)}

    def release(self, tickets: Sequence[Ticket]) -> set[str]:
        """Return held jobs to ``pending`` and give back the attempt; ids released."""
        if not tickets:
            return set()
        params = ticket_arrays(sorted(tickets))
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
            topic_counts(t for t, s in rows if s == "pending"),
            topic_counts(t for t, s in rows if s == "dead"),
        )

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[TopicCount]:
        """Delete one batch of terminal rows older than ``ttl`` in its own transaction."""
        if ttl <= timedelta(0):
            raise ValueError("retention TTL must be positive; 0 disables retention")
        with self.connector.connection() as conn, conn.transaction():
            rows = conn.execute(sql("delete_terminal"), {"ttl": ttl, "batch": batch}).fetchall()
        return topic_counts(r[0] for r in rows)

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
        params = {"topic": schedule.topic, "key_prefix": like_prefix(schedule.key_prefix)}
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
