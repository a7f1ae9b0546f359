"""Where the adapter's connections come from: a DSN, a pool, or one given connection."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.errors import IdleInTransactionSessionTimeout as IdleInTransactionTimeout
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from brooq.postgres.behind import (
    BEHIND_ERRORS,
    missing_privilege,
    missing_table,
    schema_behind,
)
from brooq.postgres.dsn import MALFORMED, scrub
from brooq.postgres.sql import sql
from brooq.vocabulary import StoreUnavailable

log = logging.getLogger("brooq.postgres")

# What a transaction-pooling PgBouncer answers to a client that acts as if it had a session
# of its own: it refuses the startup option brooq sets its statement timeout with, and a
# server connection it hands over may already hold another client's prepared statement.
_BOUNCER_REFUSES_OPTIONS = "unsupported startup parameter"
# A session ended for idling in its transaction (a settle hook that waited) is lost too.
_CONNECTION_LOST = (psycopg.OperationalError, psycopg.InterfaceError, IdleInTransactionTimeout)
_BOUNCER_STATEMENT_ERRORS = (
    psycopg.errors.DuplicatePreparedStatement,
    psycopg.errors.InvalidSqlStatementName,
)


def _password(conninfo: str | None) -> str | None:
    if not conninfo:
        return None
    try:
        value = psycopg.conninfo.conninfo_to_dict(conninfo).get("password")
    except psycopg.Error:
        return None
    return None if value is None else str(value)


def unavailable(exc: BaseException, conninfo: str | None = None) -> StoreUnavailable:
    """A StoreUnavailable for ``exc`` whose message can never carry the password."""
    if isinstance(exc, psycopg.ProgrammingError) and (
        "connection info" in str(exc) or "conninfo" in str(exc) or "percent" in str(exc)
    ):
        # libpq quotes the part of the DSN it could not parse: it may be the password.
        return StoreUnavailable(f"database unavailable: {MALFORMED}")
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return StoreUnavailable(f"database unavailable: {scrub(first, [_password(conninfo)])}")


def bouncer_detected(signature: str) -> None:
    """Switch this process to the PgBouncer profile, saying so once (QUEUE_PGBOUNCER unset).

    ``signature`` is the error that gave the bouncer away.
    """
    if PROFILE.pgbouncer:
        return
    PROFILE.pgbouncer = True
    log.warning(
        "DATABASE_URL goes through a transaction-pooling PgBouncer (%s): brooq switched to "
        "its PgBouncer profile (no prepared statements, no startup options); set "
        "QUEUE_PGBOUNCER=true to say so, and QUEUE_LISTEN_URL to a direct URL for LISTEN",
        signature,
        extra={"event": "PgBouncerDetected"},
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_conninfo(conninfo: str) -> None:
    """Raise StoreUnavailable ("malformed (value hidden)") unless libpq can parse ``conninfo``."""
    try:
        psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        raise StoreUnavailable(f"database unavailable: {MALFORMED}") from None


# A silent network (packets dropped, not refused) must not hang a worker or the
# supervisor's loop for the kernel's 15 minutes: bound connect and unacked sends,
# and probe idle connections. A DSN that sets any of these keeps its own value.
RESILIENCE = {
    "connect_timeout": "10",
    "tcp_user_timeout": "30000",
    "keepalives": "1",
    "keepalives_idle": "15",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}


def resilient(conninfo: str) -> dict[str, Any]:
    """The connection parameters brooq adds unless the DSN already sets them."""
    try:
        given = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return {}
    return {k: v for k, v in RESILIENCE.items() if k not in given}


class _Profile:
    """How this process reaches PostgreSQL; set once at start (``use_pgbouncer``)."""

    pgbouncer = False


PROFILE = _Profile()


def use_pgbouncer(on: bool = True) -> None:
    """Every connection brooq opens from a DSN in this process (and its forks) may go through
    a transaction-pooling PgBouncer: no server-side prepared statements, no startup options
    (``statement_timeout`` becomes a ``SET LOCAL`` in each operation's transaction).

    Connections and pools you give brooq are yours to configure
    (``prepare_threshold=None`` on them).
    """
    PROFILE.pgbouncer = on


def _ms(timeout: timedelta) -> int:  # whole milliseconds, at least one
    return max(1, int(timeout.total_seconds() * 1000))


def connect(
    conninfo: str,
    *,
    statement_timeout: timedelta | None = None,
    prepare: bool = True,
    idle_timeout: timedelta | None = None,
    generic_plans: bool = False,
    **kwargs: Any,
) -> psycopg.Connection[Any]:
    """Open one autocommit connection; StoreUnavailable (password-free) when it fails.

    ``statement_timeout`` and ``idle_timeout`` (``idle_in_transaction_session_timeout``)
    are set as startup options (no session state to keep) — except through
    PgBouncer (``use_pgbouncer``), which refuses startup options: there the
    Connector sets them per transaction. ``prepare=False`` (implied through
    PgBouncer) turns off psycopg's server-side prepared statements, which a
    transaction-pooling PgBouncer cannot keep. ``generic_plans``: prepared statements run on
    generic plans (a claim's custom plan over every partition cost ~3x running it: ADR 001).
    JIT compilation is off (``jit=off``) on every connection brooq opens, but through
    PgBouncer, where ``ALTER ROLE … SET jit = off`` does it.
    """
    check_conninfo(conninfo)
    params = {**resilient(conninfo), **kwargs}
    named = {
        "statement_timeout": statement_timeout,
        "idle_in_transaction_session_timeout": idle_timeout,
    }
    given = [f"-c {name}={_ms(t)}" for name, t in named.items() if t is not None]
    given += ["-c plan_cache_mode=force_generic_plan"] if generic_plans and prepare else []
    # brooq's statements are index probes of a few rows; on a table of millions their
    # estimated costs pass jit_above_cost, and compiling then took 100 ms a claim
    # (docs/operations.md, "PgBouncer settings").
    given += ["-c jit=off"]
    if PROFILE.pgbouncer:
        prepare = False
    elif given:
        params["options"] = " ".join([params.get("options", ""), *given]).strip()
    try:
        conn = psycopg.connect(conninfo, autocommit=True, **params)
    except psycopg.Error as exc:
        if "options" in params and _BOUNCER_REFUSES_OPTIONS in str(exc) and "options" not in kwargs:
            bouncer_detected("it refuses the startup parameter options")  # no more of them
            return connect(conninfo, statement_timeout=statement_timeout, prepare=False, **kwargs)
        raise unavailable(exc, conninfo) from None
    if not prepare:
        conn.prepare_threshold = None
    return conn


@dataclass(frozen=True)
class Source:
    """What a Connector connects to, and how.

    ``guard``, when given, is entered around every connect and close of the
    Connector's own connection (never around a statement): a supervisor's
    HTTP threads pass ``brooq.osproc.no_fork``, because opening and closing a
    connection take process-wide locks (name lookup, TLS, GSSAPI) that a
    forked child must not inherit held, while a statement on an open
    connection takes none.
    """

    target: str | ConnectionPool | psycopg.Connection[Any]
    statement_timeout: timedelta | None = None
    prepare: bool = True
    guard: Callable[[], contextlib.AbstractContextManager[None]] | None = None
    idle_timeout: timedelta | None = None
    """A transaction idle this long ends its session (and its locks): a worker's settle."""
    generic_plans: bool = False  # a supervisor's claims lane: see connect

    def guarded(self) -> contextlib.AbstractContextManager[None]:
        """The guard's block, or a block that does nothing."""
        return self.guard() if self.guard is not None else contextlib.nullcontext()


class Connector:
    """Hands out a connection for one operation.

    From a DSN it keeps one lazily opened autocommit connection per
    connector, closed and reopened after any error that leaves it unusable
    (broken, or still busy because a handler closed its socket). From a pool
    it borrows. From a connection it uses that connection.
    """

    def __init__(self, source: Source | str | ConnectionPool | psycopg.Connection[Any]) -> None:
        self.source = source if isinstance(source, Source) else Source(source)
        target = self.source.target
        self._conninfo = target if isinstance(target, str) else None
        self._pool = target if isinstance(target, ConnectionPool) else None
        self._given = target if isinstance(target, psycopg.Connection) else None
        pooled = self._pool.conninfo if self._pool is not None else None
        # Where a database behind this brooq may be asked which migrations it lacks.
        self.catalog_dsn = self._conninfo or (pooled if isinstance(pooled, str) else None)
        self._own: psycopg.Connection[Any] | None = None
        self._own_pid = os.getpid()
        self._inherited: list[psycopg.Connection[Any]] = []
        self._cut: list[tuple[int, int]] = []  # (backend pid, client port) of cut connections
        # Re-entrant: a settle hook that calls back into the same store (say
        # queue.enqueue during queue.drain) must not deadlock on its own lock.
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one operation; database errors of reach become StoreUnavailable."""
        try:
            if self._pool is not None:
                with self._pool.connection() as conn:
                    yield conn
            elif self._given is not None:
                yield from self._in_transaction(self._given)
            else:
                with self._lock:
                    conn, src = self._owned(), self.source
                    try:
                        if PROFILE.pgbouncer and (src.statement_timeout or src.idle_timeout):
                            yield from self._limited(conn, src)
                        else:
                            yield conn
                    except BaseException:
                        self._drop_if_unusable()
                        raise
        except _CONNECTION_LOST as exc:
            self._drop_if_unusable()
            raise unavailable(exc, self._conninfo) from exc
        except psycopg.errors.UndefinedTable as exc:
            # An unmigrated database: one clear line for every command, no traceback.
            raise missing_table(exc) from None
        except BEHIND_ERRORS as exc:
            behind = schema_behind(exc, self.catalog_dsn)
            if behind is None:
                raise
            raise behind from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise missing_privilege(exc) from None
        except _BOUNCER_STATEMENT_ERRORS as exc:
            if self._conninfo is None or PROFILE.pgbouncer:
                raise  # a connection or pool of the caller's: theirs to configure
            # Another client's prepared statement on the server connection a transaction
            # pooler handed us: a bouncer. Its next connection prepares nothing.
            bouncer_detected(_first_line(exc))
            self._drop()
            raise StoreUnavailable(
                "database unavailable: DATABASE_URL goes through a transaction-pooling "
                "PgBouncer; brooq switched to its PgBouncer profile, try again (set "
                "QUEUE_PGBOUNCER=true)"
            ) from None

    @staticmethod
    def _in_transaction(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
        # A given connection that is not autocommit would otherwise leave an
        # implicit transaction open after our statement, never committed.
        if conn.autocommit:
            yield conn
        else:
            with conn.transaction():
                yield conn

    @staticmethod
    def _limited(
        conn: psycopg.Connection[Any], source: Source
    ) -> Iterator[psycopg.Connection[Any]]:
        # Through a transaction pooler a session setting would stick to a server
        # connection someone else gets next: bound this operation's transaction only.
        limits = {"limit_statement_time": source.statement_timeout}
        limits["limit_idle_time"] = source.idle_timeout
        with conn.transaction():
            for name, t in limits.items():
                if t is not None:
                    conn.execute(sql(name), {"timeout": f"{_ms(t)}ms"})
            yield conn

    def _owned(self) -> psycopg.Connection[Any]:
        if self._own is not None and self._own_pid != os.getpid():
            # Inherited across fork: closing it would end the parent's session,
            # so keep it referenced (never finalized) and open our own.
            self._inherited.append(self._own)
            self._own = None
        self._own_pid = os.getpid()
        if self._own is None or self._own.closed or self._own.broken:
            assert self._conninfo is not None
            with self.source.guarded():
                self._own = connect(
                    self._conninfo,
                    statement_timeout=self.source.statement_timeout,
                    prepare=self.source.prepare,
                    idle_timeout=self.source.idle_timeout,
                    generic_plans=self.source.generic_plans,
                )
            self._terminate_cut(self._own)
        return self._own

    def _terminate_cut(self, conn: psycopg.Connection[Any]) -> None:
        """End the server side of the connections :meth:`abort` cut, best effort."""
        cut, self._cut = self._cut, []
        if not cut:
            return
        with contextlib.suppress(psycopg.Error):
            conn.execute(
                sql("terminate_cut_backends"),
                {"pids": [pid for pid, _ in cut], "ports": [port for _, port in cut]},
            )

    def _drop(self) -> None:
        conn, self._own = self._own, None
        if conn is not None and self._own_pid == os.getpid():
            with contextlib.suppress(Exception):
                conn.close()

    def _drop_if_unusable(self) -> None:
        conn = self._own
        if conn is None or self._own_pid != os.getpid():
            return
        try:
            idle = conn.info.transaction_status == TransactionStatus.IDLE
        except Exception:
            idle = False
        if conn.closed or conn.broken or not idle:
            with contextlib.suppress(Exception), self.source.guarded():
                conn.close()
            self._own = None

    def fileno(self) -> int | None:
        """The socket of the connection this connector opened (in this process), if open."""
        conn = self._own
        if conn is None or conn.closed or self._own_pid != os.getpid():
            return None
        try:
            return conn.fileno()
        except psycopg.Error:
            return None

    def forget(self) -> None:
        """Drop the owned connection without closing it: its descriptor may be someone
        else's now (a handler closed it and opened a file), which ``close`` would close."""
        if self._own is not None:
            self._inherited.append(self._own)  # kept referenced: never finalized
            self._own = None

    def abort(self) -> None:
        """Cut the owned connection from another thread (a statement that will not return):
        its socket is shut down, so the thread blocked in it errs at once; the next operation
        opens a new connection."""
        conn = self._own
        if conn is None or conn.closed:
            return
        with contextlib.suppress(OSError, psycopg.Error):
            sock = socket.socket(fileno=os.dup(conn.fileno()))
            with sock:
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    # The backend may only be frozen: it would still run what it was sent
                    # (a claim) once it wakes. The next connection ends it first.
                    self._cut.append((conn.info.backend_pid, sock.getsockname()[1]))
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the connection this connector opened itself (never a given one or a pool)."""
        if self._own is not None and self._own_pid == os.getpid():
            with self.source.guarded():
                self._own.close()
        self._own = None
