"""The HTTP server of the surface: its own threads, one deadline per request, a connection cap.

Threads, not the supervisor's loop: a client that is slow to send (or to
read) must never delay heartbeats, signals or the watchdog. One daemon thread
accepts; each connection gets a daemon thread that reads ONE request before
a total deadline, calls the route's handler and writes the answer before a
second deadline.

The cap: at most ``max_connections`` connections are served at once. A new
connection past the cap takes the slot of the oldest connection that is
still waiting on its client (reading the request or writing the answer),
which is shut down at once: a real client sends its request the moment it
connects, so the oldest reader is the likeliest to be a slow one, and a
probe gets through while slow clients hold every slot. When every slot is
running a handler, the new connection is answered 503 without being read
and closed. Nothing queues but the kernel's listen backlog.

Fork safety: the supervisor forks children while these threads run. Every
socket the server opens is registered under one lock that ``os.fork`` also
takes (``os.register_at_fork``), and a forked child closes them all at once:
no child holds a client's connection open, nor the listening socket.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from brooq.surface.guard import HostGuard, SurfaceConfigError, parse_addr
from brooq.surface.router import Router
from brooq.surface.wire import (
    MAX_BODY_BYTES,
    HttpError,
    PeerGone,
    Request,
    Response,
    read_request,
    send_all,
    send_nowait,
)

log = logging.getLogger("brooq.surface")

ACCEPT_POLL_S = 0.25  # how often the acceptor checks for close() if nothing wakes it
_FORK_LOCK = threading.Lock()
_LIVE: weakref.WeakSet[SurfaceServer] = weakref.WeakSet()
_BUSY = Response.json(503, {"error": "too many connections; try again"}).encode()
_MISDIRECTED = Response.json(
    421,
    {
        "error": "misdirected request: the Host header does not name this server "
        "(add the name to HTTP_ALLOWED_HOSTS if it does)"
    },
)


@dataclass(frozen=True)
class Limits:
    """Time and size bounds of the server (seconds, connections, bytes)."""

    request_timeout: float = 1.0
    """Total time a client has to send its whole request (line, headers, body)."""
    write_timeout: float = 2.0
    """Total time a client has to take the whole answer."""
    max_connections: int = 32
    max_body_bytes: int = MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.request_timeout <= 0 or self.write_timeout <= 0 or self.max_connections < 1:
            raise ValueError(f"surface limits out of range: {self}")


class _Conn:
    """One accepted connection; its fields change under _FORK_LOCK only."""

    def __init__(self, sock: socket.socket, client: str) -> None:
        self.sock, self.client = sock, client
        self.started = time.monotonic()
        self.phase = "reading"  # reading → handling → writing
        self.evicted = False
        self.thread: threading.Thread | None = None

    def shut(self) -> None:
        """Wake the connection's thread out of any blocking call (its socket stays open)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class SurfaceServer:
    """Serves a :class:`Router` on ``addr``. Binds at construction, serves after :meth:`start`.

    With ``allowed_hosts`` (names besides the address itself), a request
    whose ``Host`` names another server is answered 421 (DNS rebinding, see
    :class:`brooq.surface.guard.HostGuard`), except on ``any_host_paths``.

    Handlers run in the server's threads, several at once: they must be
    thread-safe and must not use a connection or object owned by another
    thread (the supervisor's loop above all).
    """

    def __init__(
        self,
        addr: str,
        router: Router,
        limits: Limits | None = None,
        *,
        allowed_hosts: Sequence[str] | None = None,
        any_host_paths: Collection[str] = (),
    ) -> None:
        self.router, self.limits = router, limits or Limits()
        host, port = parse_addr(addr)
        self.hosts = None if allowed_hosts is None else HostGuard(host, allowed_hosts)
        """None: any Host; else requests not naming this server are answered 421."""
        self.any_host_paths = frozenset(any_host_paths)
        self._listener = self._listen(addr, host, port)
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        """``host:port`` actually bound (the port is chosen by the system for port 0)."""
        self._conns: set[_Conn] = set()
        self._closing = threading.Event()
        self._acceptor: threading.Thread | None = None
        with _FORK_LOCK:
            _LIVE.add(self)

    @staticmethod
    def _listen(addr: str, host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise SurfaceConfigError(f"cannot listen on {addr}: {exc.strerror or exc}") from None
        return sock

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> SurfaceServer:
        """Start accepting in a daemon thread; returns at once."""
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="brooq-http-accept", daemon=True
        )
        self._acceptor.start()
        return self

    def close(self, timeout: float = 1.0) -> None:
        """Stop accepting, cut every connection, wait ≤ ``timeout`` s for their threads.

        A handler stuck in a slow call keeps running in its daemon thread; the
        server does not wait for it past ``timeout``.
        """
        deadline = time.monotonic() + timeout
        self._closing.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the acceptor's select at once
        if self._acceptor is not None:
            self._acceptor.join(max(0.0, deadline - time.monotonic()))
        with _FORK_LOCK:
            self._listener.close()
            conns = list(self._conns)
            for conn in conns:
                conn.shut()
        for conn in conns:
            if conn.thread is not None:
                conn.thread.join(max(0.0, deadline - time.monotonic()))

    def open_connections(self) -> int:
        """Connections holding a slot now (evicted ones still closing are not counted)."""
        with _FORK_LOCK:
            return sum(1 for c in self._conns if not c.evicted)

    def _forget_in_child(self) -> None:
        """In a forked child: close this process's copies of every socket, serve nothing."""
        self._closing.set()
        self._listener.close()
        for conn in self._conns:
            conn.sock.close()
        self._conns.clear()

    # --- accepting ------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], ACCEPT_POLL_S)
            except (OSError, ValueError):
                return  # the listener was closed under us: close() is under way
            try:
                accepted = not ready or self._accept_one()
            except Exception:  # the acceptor must outlive any one connection's trouble
                log.warning("http accept failed", exc_info=True, extra={"event": "HttpError"})
                accepted = False
            if not accepted:
                time.sleep(0.05)  # out of file descriptors or threads, say: do not spin

    def _accept_one(self) -> bool:
        """Accept one connection and give it a thread (or refuse it); False on an accept error."""
        with _FORK_LOCK:  # the socket is registered before any fork can copy it
            if self._closing.is_set():
                return True
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                log.warning("http accept failed: %s", exc, extra={"event": "HttpAcceptFailed"})
                return False
            conn = _Conn(sock, f"{peer[0]}:{peer[1]}")
            if not self._make_room():
                send_nowait(sock, _BUSY)
                sock.close()
                log.debug(
                    "http connection refused: every slot runs a handler",
                    extra={"event": "HttpRefused", "client": conn.client},
                )
                return True
            self._conns.add(conn)
            conn.thread = threading.Thread(
                target=self._serve, args=(conn,), daemon=True, name=f"brooq-http {conn.client}"
            )
        try:
            conn.thread.start()
        except RuntimeError:  # no thread to be had: give the slot back at once
            with _FORK_LOCK:
                self._conns.discard(conn)
                conn.sock.close()
            raise
        return True

    def _make_room(self) -> bool:
        """True when a new connection may have a slot, evicting the oldest waiting one if full."""
        held = [c for c in self._conns if not c.evicted]
        if len(held) < self.limits.max_connections:
            return True
        waiting = [c for c in held if c.phase != "handling"]
        if not waiting:
            return False
        victim = min(waiting, key=lambda c: c.started)
        victim.evicted = True
        victim.shut()
        log.debug(
            "http connection evicted for a new one",
            extra={
                "event": "HttpEvicted",
                "client": victim.client,
                "held_s": round(time.monotonic() - victim.started, 3),
            },
        )
        return True

    # --- one connection -------------------------------------------------------------------

    def _serve(self, conn: _Conn) -> None:
        try:
            self._exchange(conn)
        except Exception:
            log.warning("http connection failed", exc_info=True, extra={"event": "HttpError"})
        finally:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            with _FORK_LOCK:
                self._conns.discard(conn)
                conn.sock.close()

    def _exchange(self, conn: _Conn) -> None:
        """Read one request before the deadline, answer it, bounded; errors are answers."""
        try:
            request = read_request(
                conn.sock,
                conn.started + self.limits.request_timeout,
                conn.client,
                self.limits.max_body_bytes,
            )
        except PeerGone:
            return
        except HttpError as exc:  # includes the deadline (408): answered, never waited on
            send_nowait(conn.sock, Response.json(exc.status, {"error": exc.message}).encode())
            log.debug(
                "http request refused: %s",
                exc.message,
                extra={"event": "HttpRefused", "client": conn.client, "status": exc.status},
            )
            return
        self._phase(conn, "handling")
        response = self._respond(request)
        self._phase(conn, "writing")
        try:
            send_all(
                conn.sock,
                response.encode(head_only=request.method == "HEAD"),
                time.monotonic() + self.limits.write_timeout,
            )
        except (HttpError, PeerGone):
            return
        log.debug(
            "http %s %s %d",
            request.method,
            request.path,
            response.status,
            extra={"event": "HttpRequest", "client": conn.client},
        )

    @staticmethod
    def _phase(conn: _Conn, phase: str) -> None:
        with _FORK_LOCK:
            conn.phase = phase

    def _respond(self, request: Request) -> Response:
        if (
            self.hosts is not None
            and request.path not in self.any_host_paths
            and not self.hosts.allows(request)
        ):
            log.debug(
                "http request refused: Host is not this server",
                extra={"event": "HttpRefused", "client": request.client, "status": 421},
            )
            return _MISDIRECTED
        try:
            return self.router.dispatch(request)
        except Exception:
            # The detail goes to the log, never to the client (no paths, no versions).
            log.warning(
                "http handler failed: %s %s",
                request.method,
                request.path,
                exc_info=True,
                extra={"event": "HttpError"},
            )
            return Response.json(500, {"error": "internal error; see the supervisor's log"})


def _forget_all_in_child() -> None:
    try:
        for server in list(_LIVE):
            server._forget_in_child()
    finally:
        _FORK_LOCK.release()


os.register_at_fork(
    before=_FORK_LOCK.acquire,
    after_in_parent=_FORK_LOCK.release,
    after_in_child=_forget_all_in_child,
)
