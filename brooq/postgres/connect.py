"""Where the store's connections come from: a DSN, a pool, or one given connection."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from brooq.vocabulary import StoreUnavailable

_PASSWORD_URL_RE = re.compile(r"(://[^:/@]*:)[^@]*@")
_PASSWORD_KV_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with any DSN password replaced by ``***``."""
    return _PASSWORD_KV_RE.sub(r"\1***", _PASSWORD_URL_RE.sub(r"\1***@", text))


def unavailable(exc: BaseException, conninfo: str | None = None) -> StoreUnavailable:
    """A StoreUnavailable for ``exc`` whose message can never carry the password."""
    if isinstance(exc, psycopg.ProgrammingError) and "connection info" in str(exc):
        # libpq quotes the part of the DSN it could not parse: it may be the password.
        return StoreUnavailable("database unavailable: the connection string is malformed "
                                "(value hidden); check DATABASE_URL")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    message = redact(first)
    if conninfo:
        try:
            pw = psycopg.conninfo.conninfo_to_dict(conninfo).get("password")
        except psycopg.Error:
            pw = None
        if pw:
            message = message.replace(str(pw), "***")
    return StoreUnavailable(f"database unavailable: {message}")


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


def connect(conninfo: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open one autocommit connection; StoreUnavailable (password-free) when it fails."""
    try:
        return psycopg.connect(conninfo, autocommit=True, **{**resilient(conninfo), **kwargs})
    except psycopg.Error as exc:
        raise unavailable(exc, conninfo) from None


class Connector:
    """Hands out a connection for one operation.

    From a DSN it keeps one lazily opened autocommit connection per
    connector, reopened when broken (a worker slot needs no more). From a
    pool it borrows. From a connection it uses that connection.
    """

    def __init__(self, source: str | ConnectionPool | psycopg.Connection[Any]) -> None:
        self._conninfo = source if isinstance(source, str) else None
        self._pool = source if isinstance(source, ConnectionPool) else None
        self._given = source if isinstance(source, psycopg.Connection) else None
        self._own: psycopg.Connection[Any] | None = None
        self._own_pid = os.getpid()
        self._inherited: list[psycopg.Connection[Any]] = []
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
                    yield self._owned()
        except psycopg.OperationalError as exc:
            self._drop_broken()
            raise unavailable(exc, self._conninfo) from exc

    @staticmethod
    def _in_transaction(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
        # A given connection that is not autocommit would otherwise leave an
        # implicit transaction open after our statement, never committed.
        if conn.autocommit:
            yield conn
        else:
            with conn.transaction():
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
            self._own = connect(self._conninfo)
        return self._own

    def _drop_broken(self) -> None:
        if self._own is not None and (self._own.closed or self._own.broken):
            self._own = None

    def close(self) -> None:
        """Close the connection this connector opened itself (never a given one or a pool)."""
        if self._own is not None and self._own_pid == os.getpid():
            self._own.close()
        self._own = None
