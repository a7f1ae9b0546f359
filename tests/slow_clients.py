"""Slow HTTP clients (slowloris) for the surface tests: bytes trickled, reconnection when cut.

Every client runs in a daemon thread of the test process and stops at its
deadline or at ``stop()``; every socket call has a timeout.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from dataclasses import dataclass, field

SLOW_PREFIX = b"GET /healthz HTTP/1.1\r\nX: "


@dataclass
class SlowStats:
    """What the slow clients saw, for assertions and failure messages."""

    connections: int = 0
    refused: int = 0
    cut_after: list[float] = field(default_factory=list)
    """Seconds each connection lasted until the server closed it (or answered)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cut(self, seconds: float) -> None:
        """Record a connection the server ended after ``seconds``."""
        with self.lock:
            self.cut_after.append(seconds)


class Slowloris:
    """``n`` clients, each sending ``prefix`` then one byte a second until ``duration`` is over.

    With ``reconnect`` a client that the server cuts off connects again at
    once (after ``pause`` s), so the pressure lasts the whole duration.
    """

    def __init__(
        self,
        host: str,
        port: int,
        n: int = 50,
        duration: float = 30.0,
        prefix: bytes = SLOW_PREFIX,
        reconnect: bool = True,
        pause: float = 0.05,
    ) -> None:
        self.host, self.port, self.n = host, port, n
        self.duration, self.prefix = duration, prefix
        self.reconnect, self.pause = reconnect, pause
        self.stats = SlowStats()
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.end = 0.0

    def start(self) -> Slowloris:
        """Start every client; returns once each has tried its first connection."""
        self.end = time.monotonic() + self.duration
        started = threading.Barrier(self.n + 1)
        for _ in range(self.n):
            t = threading.Thread(target=self._client, args=(started,), daemon=True)
            t.start()
            self.threads.append(t)
        started.wait(timeout=30)
        return self

    def stop(self) -> None:
        """Stop every client and close its socket (bounded)."""
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=5)

    def _over(self) -> bool:
        return self.stopped.is_set() or time.monotonic() >= self.end

    def _client(self, started: threading.Barrier) -> None:
        first = True
        while not self._over():
            sock = self._connect()
            if first:
                first = False
                with contextlib.suppress(threading.BrokenBarrierError):
                    started.wait(timeout=30)
            if sock is None:
                time.sleep(self.pause)
                continue
            with sock:
                self._trickle(sock)
            if not self.reconnect:
                return
            time.sleep(self.pause)

    def _connect(self) -> socket.socket | None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=2.0)
            sock.sendall(self.prefix)
        except OSError:
            with self.stats.lock:
                self.stats.refused += 1
            return None
        with self.stats.lock:
            self.stats.connections += 1
        return sock

    def _trickle(self, sock: socket.socket) -> None:
        """One byte a second until the server closes (or answers) or time is up."""
        opened = time.monotonic()
        next_byte = opened + 1.0
        while not self._over():
            wait = max(0.0, min(next_byte, self.end) - time.monotonic())
            readable, _, _ = select.select([sock], [], [], min(wait, 0.2))
            if readable:  # EOF, a reset or an answer: the server is done with us
                self.stats.cut(time.monotonic() - opened)
                return
            if time.monotonic() >= next_byte:
                try:
                    sock.send(b"x")
                except OSError:
                    self.stats.cut(time.monotonic() - opened)
                    return
                next_byte += 1.0
