"""The supervisor's one LISTEN: new jobs, cancels and pauses, heard on a thread of its own.

The thread blocks on the LISTEN connection (reconnecting with a backoff while
the database is away) and hands what it hears to the loop through a queue
and a wakeup pipe, so that no connect or read can stall the loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
from datetime import timedelta

from brooq.logs import event, listen_off
from brooq.osproc import no_fork
from brooq.postgres.listen import Heard, Listener

log = logging.getLogger("brooq.supervisor")

WAIT = timedelta(seconds=1)
MAX_BACKOFF_S = 10.0


class Notices:
    """Runs a Listener on a daemon thread; ``fileno()`` is readable when something arrived.

    ``pooled``: ``dsn`` is DATABASE_URL itself (no QUEUE_LISTEN_URL), so LISTEN stops once
    a PgBouncer is detected there (brooq.postgres.listen)."""

    def __init__(
        self, dsn: str | None, poll_interval: timedelta = WAIT, pooled: bool = False
    ) -> None:
        self.listener = Listener(dsn, pauses=True, pooled=pooled)
        self._heard: queue.SimpleQueue[Heard] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self.connected = False
        self._thread = threading.Thread(target=self._serve, name="brooq-listen", daemon=True)
        if dsn is None:
            listen_off(poll_interval)
        else:
            self._thread.start()

    def fileno(self) -> int:
        """Readable when notifications wait for :meth:`read`."""
        return self._read

    def read(self) -> Heard:
        """Everything heard since the last call."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass
        heard = Heard()
        while True:
            try:
                more = self._heard.get_nowait()
            except queue.Empty:
                return heard
            heard.merge(more)

    def _serve(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            with no_fork():
                fd = self.listener.fileno()
            if fd is None:
                if self.listener.dsn is None:
                    self.connected = False
                    return  # LISTEN is off for good: a PgBouncer was detected (ListenOff)
                if self.connected:
                    event(log, "ListenLost", logging.WARNING, retry_in_s=backoff)
                self.connected = False
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if not self.connected or self.listener.missed:
                # Jobs enqueued while nobody listened were announced to nobody:
                # tell the loop to look, as if every topic had been notified.
                self.listener.missed = False
                self._post(Heard(topics={"*"}))
            self.connected, backoff = True, 0.2
            # Wait outside the guard (a fork may happen meanwhile), read inside it.
            with contextlib.suppress(OSError, ValueError):
                select.select([fd], [], [], WAIT.total_seconds())
            with no_fork():
                heard = self.listener.read()
            if heard:
                self._post(heard)

    def _post(self, heard: Heard) -> None:
        self._heard.put(heard)
        with contextlib.suppress(OSError):
            os.write(self._write, b".")

    def stop(self) -> None:
        """End the thread and close the LISTEN connection."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(WAIT.total_seconds() + 1)
        self.listener.close()
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
