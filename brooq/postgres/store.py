"""The PostgreSQL implementation of the Store port: guarded statements from queries.sql."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal, TypeGuard

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from brooq.engine.outcome import Outcome, SettleKind, clean_reason
from brooq.engine.results import wait_for_result_async
from brooq.engine.store import (
    Claimed,
    ClaimedBatch,
    SettleHookFailed,
    Ticket,
)
from brooq.postgres.behind import on_callers_connection
from brooq.postgres.connect import PROFILE, Connector, Source
from brooq.postgres.enqueue import enqueue_on, enqueue_on_async
from brooq.postgres.floors import Floors, claim_from_floors
from brooq.postgres.limited import KeyWalk, claim_limited
from brooq.postgres.pausing import PostgresPauses
from brooq.postgres.results import job_key, wait_listening, wait_listening_async, wait_polling
from brooq.postgres.rows import (
    claimed_rows,
    hidden,
    outcomes_json,
    passwords_of,
    record,
    settle_params,
    ticket_arrays,
)
from brooq.postgres.sql import sql
from brooq.postgres.upkeep import PostgresUpkeep, ReapWindow, retrying
from brooq.postgres.workflows import PostgresWorkflows
from brooq.vocabulary import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Enqueued,
    Fairness,
    Job,
    JobNotFound,
    JobRecord,
    RateLimit,
    SettleHook,
    parse_job_id,
)
from brooq.vocabulary import app_version as app_version_of

__all__ = ["PostgresStore", "is_database_source"]


class PostgresStore(PostgresUpkeep, PostgresWorkflows, PostgresPauses):
    """The Store port over PostgreSQL. The only place brooq writes jobs with SQL.

    ``source`` is a DSN (one lazily opened connection), a psycopg_pool
    ConnectionPool, or a psycopg Connection. Nothing connects until the first
    operation. ``statement_timeout`` (DSN only) bounds every statement of the
    store's own connection on the server side; ``idle_timeout`` (DSN only) ends
    its session when a transaction of it sits idle that long.
    ``app_version`` (None: none) is stamped on every job it enqueues, and its
    claims take only jobs of that version and jobs with none (brooq.vocabulary.versions).
    ``generic_plans`` (DSN only) runs its prepared statements on generic plans (see
    brooq.postgres.connect.connect): a supervisor's claims lane.
    """

    def __init__(
        self,
        source: str | ConnectionPool | psycopg.Connection[Any],
        *,
        notify: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        statement_timeout: timedelta | None = None,
        prepare: bool = True,
        listen_dsn: str | Literal["auto"] | None = "auto",
        idle_timeout: timedelta | None = None,
        app_version: str | None = None,
        generic_plans: bool = False,
    ) -> None:
        self.app_version = app_version_of(app_version)
        self.connector = Connector(
            Source(
                source,
                statement_timeout,
                prepare,
                idle_timeout=idle_timeout,
                generic_plans=generic_plans,
            )
        )
        self._secrets = passwords_of(source)
        self._turn = False
        self._walks: dict[str, KeyWalk] = {}
        self.reap_window = ReapWindow()
        """Per keyed, rate-limited topic: where its next claim's walk over keys starts."""
        # A store on a caller's connection claims inside the caller's transaction, which
        # may roll back after the floors moved on: it claims from each topic's start.
        self._floors: dict[str | None, Floors] | None = (
            None if isinstance(source, psycopg.Connection) else {}
        )
        """Per app version served: where each topic's claims read from (floors.py). A
        floor passes the rows of other versions, so a store that changes its version
        starts that version's floors anew."""
        self.notify = notify
        self.max_payload_bytes = max_payload_bytes
        self._listen_dsn = listen_dsn if listen_dsn != "auto" else _listen_dsn_of(source)
        # LISTEN on the DSN the store connects with (no QUEUE_LISTEN_URL): off with a bouncer.
        self._listen_pooled = self._listen_dsn == _listen_dsn_of(source)

    @property
    def listen_dsn(self) -> str | None:
        """Where a result waiter LISTENs: the store's DSN (or the pool's), unless connections
        go through a transaction-pooling bouncer; None: waiters poll."""
        if self._listen_dsn is not None and PROFILE.pgbouncer and self._listen_pooled:
            return None
        return self._listen_dsn

    @property
    def dsn(self) -> str | None:
        """The DSN the store connects with, when it was given one."""
        source = self.connector.source.target
        return source if isinstance(source, str) else None

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """The decoded result of a ``done`` job, waiting up to ``timeout`` seconds for the job
        to end (None: no limit). JobDead/JobCanceled, ResultTimeout, JobNotFound."""
        if (listen := self.listen_dsn) is not None:
            return wait_listening(listen, self._listen_pooled, self.get, job_id, timeout)
        return wait_polling(self.get, job_id, timeout)

    async def result_async(self, job_id: str, timeout: float | None = None) -> Any:
        """:meth:`result` for asyncio apps (the event loop is never blocked)."""
        if (listen := self.listen_dsn) is not None:
            return await wait_listening_async(
                listen, self._listen_pooled, self.get, job_id, timeout
            )

        async def get(key: str) -> JobRecord:
            return await asyncio.to_thread(self.get, key)

        return await wait_for_result_async(job_key(job_id), get, asyncio.sleep, timeout)

    def enqueue_many(self, jobs: Sequence[Job], conn: Any = None) -> list[Enqueued]:
        """Insert jobs in one statement; in ``conn``'s open transaction when given."""
        if conn is not None:
            with on_callers_connection():
                return enqueue_on(conn, jobs, **self._enqueue_options)
        # One statement is atomic on its own: no BEGIN/COMMIT round trips.
        with self.connector.connection() as own:
            return enqueue_on(own, jobs, **self._enqueue_options)

    async def enqueue_many_async(self, jobs: Sequence[Job], conn: Any) -> list[Enqueued]:
        """Insert jobs on an asyncio connection, in its open transaction."""
        return await enqueue_on_async(conn, jobs, **self._enqueue_options)

    @property
    def _enqueue_options(self) -> dict[str, Any]:
        return {
            "notify": self.notify,
            "max_payload_bytes": self.max_payload_bytes,
            "app_version": self.app_version,
        }

    def claim(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limits: Mapping[str, int] | None = None,
        rates: Mapping[str, RateLimit] | None = None,
        fair: Mapping[str, Fairness] | None = None,
    ) -> Claimed | None:
        """Take the next ready job of ``topics`` (see claim_many)."""
        claimed = self.claim_many(holder, topics, lease, 1, limits, rates, fair)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        holder: str,
        topics: Sequence[str],
        lease: timedelta,
        limit: int,
        limits: Mapping[str, int] | None = None,
        rates: Mapping[str, RateLimit] | None = None,
        fair: Mapping[str, Fairness] | None = None,
    ) -> ClaimedBatch:
        """Take up to ``limit`` ready jobs of ``topics``: one guarded statement, SKIP LOCKED.

        Paused topics are left out (as read at most PAUSE_REFRESH_S ago).

        Topics in ``limits`` (max_running), ``rates`` (rate_limit) or ``fair``
        (fairness) are claimed under a per-topic transaction lock, so the cap, the
        rate and the keys' turns hold across every host. Free and limited topics
        take turns to go first, so neither group starves the other.
        """
        caps, rated, fairs = limits or {}, rates or {}, fair or {}
        topics = self.pause_view.active(topics)
        free = [t for t in topics if t not in caps and t not in rated and t not in fairs]
        capped = [t for t in topics if t in caps or t in rated or t in fairs]
        self._turn = not self._turn
        out = ClaimedBatch()
        for group in [free, capped] if self._turn else [capped, free]:
            if group and len(out) < limit:
                take = limit - len(out)
                if group is capped:
                    self._claim_capped(out, holder, group, lease, take, (caps, rated, fairs))
                else:
                    out.extend(self._claim_free(holder, group, lease, take))
        if len(out) >= limit:
            out.rate_limited.clear()  # not cut short: whatever waits is for the next claim
        return out

    def _claim_free(
        self, holder: str, topics: Sequence[str], lease: timedelta, limit: int
    ) -> list[Claimed]:
        params: dict[str, Any] = {
            "holder": holder,
            "lease": lease,
            "limit": limit,
            "app_version": self.app_version,
        }
        if self._floors is not None:
            floors = self._floors.setdefault(self.app_version, Floors())
            rows = claim_from_floors(self.connector, floors, list(topics), params)
            return claimed_rows(rows, holder)
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
        limited: tuple[Mapping[str, int], Mapping[str, RateLimit], Mapping[str, Fairness]],
    ) -> None:
        limits, rates, fair = limited
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
                self.app_version,
                fair.get(topic),
                self._walks,
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
        retrying(self.connector, sql("declare_rates"), params, fetch=False)

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
                return conn.execute(sql("settle"), params).fetchone() is not None
            with conn.transaction():
                if conn.execute(sql("settle"), params).fetchone() is None:
                    return False
                self._run_effects(conn, chain, hooks)
            return True

    def _run_effects(
        self, conn: psycopg.Connection[Any], chain: Sequence[Job], hooks: Sequence[SettleHook]
    ) -> None:
        try:
            if chain:
                enqueue_on(conn, chain, **self._enqueue_options)
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
        rows = retrying(self.connector, sql("settle_many"), {"outcomes": outcomes})
        return {str(r[0]) for r in rows}

    def heartbeat(self, tickets: Sequence[Ticket], lease: timedelta) -> set[str]:
        """Extend every lease still held, in one statement; return the ids extended."""
        if not tickets:
            return set()
        params = {"lease": lease, **ticket_arrays(sorted(tickets))}
        return {str(r[0]) for r in retrying(self.connector, sql("heartbeat"), params)}

    def release(self, tickets: Sequence[Ticket]) -> set[str]:
        """Return held jobs to ``pending`` and give back the attempt; ids released."""
        if not tickets:
            return set()
        params = ticket_arrays(sorted(tickets))
        return {str(r[0]) for r in retrying(self.connector, sql("release"), params)}

    def release_unknown(self, holder: str, known: Sequence[str]) -> set[str]:
        """Give back, uncharged, the rows ``holder`` holds that are not in ``known``."""
        params = {"holder": holder, "known": list(known)}
        return {str(r[0]) for r in retrying(self.connector, sql("release_unknown"), params)}

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

    @staticmethod
    def _key(job_id: str) -> str:
        try:
            return parse_job_id(job_id)
        except ValueError as exc:
            raise JobNotFound(str(exc)) from None

    def close(self) -> None:
        """Close the connection the store opened itself."""
        self.connector.close()


def _listen_dsn_of(source: object) -> str | None:
    """The DSN a result waiter may LISTEN on, from the store's source (a given connection
    tells no password: its waiters poll)."""
    if isinstance(source, str):
        return source
    if isinstance(source, ConnectionPool) and isinstance(source.conninfo, str):
        return source.conninfo
    return None


def is_database_source(
    source: object,
) -> TypeGuard[str | ConnectionPool | psycopg.Connection[Any]]:
    """True for what :class:`PostgresStore` connects with: a DSN, a pool or a connection."""
    return isinstance(source, str | ConnectionPool | psycopg.Connection)
