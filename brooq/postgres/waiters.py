"""Result waiters of one process share one LISTEN connection per DSN.

Every ``queue.result`` (threads) and ``queue.result_async`` (event loops) of a
process waiting on the same DSN registers with one :class:`SharedListener`:
a daemon thread that holds the only LISTEN connection (``brooq_done`` and
``brooq_cancel``) and, whenever anything arrives, wakes every waiter to read
its own row again (through the store's connection, not a connection of its
own). One NOTIFY is sent per settle statement, not per job, so a waiter cannot
tell whose job ended: it looks. The thread also wakes every waiter once it
starts (or starts again) to listen, since a notification sent before that
was not heard; while it cannot connect, waiters fall back to looking every
POLL_S, as they always do. It closes its connection and ends once no waiter
has been registered for LINGER_S. A forked child starts with none: it never
uses its parent's thread or socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psycopg

from brooq.postgres.listen import listen_connection
from brooq.postgres.sql import sql

LINGER_S = 5.0
"""The listener keeps its connection this long after its last waiter left (so that waiting
for many results in turn does not connect again for each)."""
TICK_S = 0.5
"""How often the listener's thread looks whether it still has waiters."""
RETRY_MAX_S = 5.0
"""At most this long between two attempts to connect again."""


class SharedListener:
    """The one LISTEN connection of this process for one DSN, and the waiters it wakes."""

    def __init__(self, dsn: str, pooled: bool = False) -> None:
        self.dsn, self.pooled = dsn, pooled
        self._cond = threading.Condition()
        self._generation = 0
        self._waiters = 0
        self._loops: dict[asyncio.Event, asyncio.AbstractEventLoop] = {}
        self._thread: threading.Thread | None = None
        self._last_left = time.monotonic()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[Callable[[float], None]]:
        """Register a thread's waiter; its ``wait(seconds)``: returns when something was
        heard since the waiter last looked, or after ``seconds``."""
        seen = self._join()

        def wait(seconds: float) -> None:
            nonlocal seen
            with self._cond:
                self._cond.wait_for(lambda: self._generation != seen, timeout=seconds)
                seen = self._generation

        try:
            yield wait
        finally:
            self._leave()

    @contextlib.asynccontextmanager
    async def waiting_async(self) -> AsyncIterator[Callable[[float], Awaitable[None]]]:
        """:meth:`waiting` for a coroutine: the event loop is never blocked."""
        heard = asyncio.Event()
        with self._cond:
            self._loops[heard] = asyncio.get_running_loop()
        self._join()

        async def wait(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(heard.wait(), seconds)
            heard.clear()

        try:
            yield wait
        finally:
            with self._cond:
                self._loops.pop(heard, None)
            self._leave()

    def _join(self) -> int:
        with self._cond:
            self._waiters += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="brooq-result-listener", daemon=True
                )
                self._thread.start()
            return self._generation

    def _leave(self) -> None:
        with self._cond:
            self._waiters -= 1
            self._last_left = time.monotonic()

    def _heard(self) -> None:
        """Wake every waiter: something ended, or notifications may have been missed."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            loops = list(self._loops.items())
        for event, loop in loops:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(event.set)

    def _done(self) -> bool:
        """True (and the thread forgotten) once nobody waited for LINGER_S."""
        with self._cond:
            if self._waiters or time.monotonic() - self._last_left < LINGER_S:
                return False
            self._thread = None
            return True

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None  # this thread's alone
        pause = 0.2
        try:
            while not self._done():
                if conn is None:
                    conn = self._listen()
                    if conn is None:
                        time.sleep(pause)
                        pause = min(pause * 2, RETRY_MAX_S)
                        continue
                    pause = 0.2
                    self._heard()  # listening from now on: what ended before, look again
                conn = self._read(conn)
        finally:
            _close(conn)

    def _listen(self) -> psycopg.Connection[Any] | None:
        statements = [sql("listen_done"), sql("listen_cancels")]
        try:
            return listen_connection(self.dsn, statements, self.pooled)
        except Exception:  # down, or a DSN the waiters' own reads will name: they poll
            return None

    def _read(self, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any] | None:
        """Wait up to TICK_S for a notification; the connection, or None once it broke."""
        try:
            got = any(True for _ in conn.notifies(timeout=TICK_S, stop_after=1))
            if got:
                for _ in conn.notifies(timeout=0):  # one wake-up covers all that came
                    pass
        except psycopg.Error:
            _close(conn)
            self._heard()  # what is sent while it connects again is lost: look again
            return None
        if got:
            self._heard()
        return conn


def _close(conn: psycopg.Connection[Any] | None) -> None:
    if conn is not None:
        with contextlib.suppress(psycopg.Error):
            conn.close()


_listeners: dict[tuple[str, bool], SharedListener] = {}
_lock = threading.Lock()


def shared_listener(dsn: str, pooled: bool = False) -> SharedListener:
    """This process's listener for ``dsn`` (made on first use); ``pooled``: ``dsn`` is the
    one the store connects with, so no LISTEN once a PgBouncer is detected there."""
    with _lock:
        listener = _listeners.get((dsn, pooled))
        if listener is None:
            listener = _listeners[dsn, pooled] = SharedListener(dsn, pooled)
        return listener


def _forget_in_child() -> None:
    # The parent's thread does not exist here, and its socket is not ours to use or close.
    global _lock
    _listeners.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
