"""The service surface on HTTP_ADDR: /metrics, /healthz, and token-guarded job endpoints.

It is served from the supervisor's own loop, one request at a time with a
short socket timeout: no thread exists in a process that forks, and a
/healthz answer proves the loop is alive. The job endpoints need a bearer
token (compared in constant time) and are disabled without one.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from brooq.vocabulary import BrooqError, InvalidInput, JobNotFound

log = logging.getLogger("brooq.http")

_JOB_PATH = re.compile(r"^/jobs/([0-9a-fA-F-]{1,64})(/cancel)?$")


class SurfaceConfigError(InvalidInput):
    """HTTP_ADDR is not usable as given (not loopback without the flag, or no token)."""


@dataclass
class Endpoints:
    """What the surface asks its owner (the supervisor)."""

    metrics: Callable[[], bytes]
    health: Callable[[], tuple[bool, str]]
    get_job: Callable[[str], dict[str, Any]]
    cancel_job: Callable[[str], dict[str, Any]]
    token: str | None


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets) into a pair."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise SurfaceConfigError(f"HTTP_ADDR {addr!r} must look like 127.0.0.1:8090")
    return host.strip("[]"), int(port)


def check_bind(host: str, token: str | None, allow_remote: bool) -> None:
    """Refuse a non-loopback address unless explicitly allowed and guarded by a token."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return
    if not allow_remote:
        raise SurfaceConfigError(
            f"HTTP_ADDR host {host!r} is not loopback; pass --http-allow-remote (and set a "
            "token) to expose the surface, or put it behind a proxy"
        )
    if not token:
        raise SurfaceConfigError(f"HTTP_ADDR host {host!r} is not loopback: set BROOQ_TOKEN first")


class _Handler(BaseHTTPRequestHandler):
    timeout = 2.0  # a slow client cannot hold the supervisor loop for long
    server: _Server

    def do_GET(self) -> None:
        ep = self.server.endpoints
        if self.path == "/metrics":
            self._send(200, ep.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/healthz":
            ok, reason = ep.health()
            self._json(200 if ok else 503, {"ok": ok, "reason": reason})
        elif match := _JOB_PATH.match(self.path):
            if not match.group(2) and self._authorized():
                self._job_call(ep.get_job, match.group(1))
            elif match.group(2):
                self._json(405, {"error": "use POST to cancel"})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        match = _JOB_PATH.match(self.path)
        if match and match.group(2) and self._authorized():
            self._job_call(self.server.endpoints.cancel_job, match.group(1))
        elif not match or not match.group(2):
            self._json(404, {"error": "not found"})

    def _authorized(self) -> bool:
        token = self.server.endpoints.token
        if not token:
            self._json(404, {"error": "job endpoints are disabled: no token is configured"})
            return False
        given = self.headers.get("Authorization", "")
        expected = f"Bearer {token}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            self._json(401, {"error": "missing or wrong bearer token"})
            return False
        return True

    def _job_call(self, call: Callable[[str], dict[str, Any]], job_id: str) -> None:
        try:
            self._json(200, call(job_id))
        except JobNotFound as exc:
            self._json(404, {"error": str(exc)})
        except BrooqError as exc:
            self._json(503, {"error": str(exc)})

    def _json(self, status: int, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body, default=str).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args, extra={"event": "HttpRequest"})


class _Server(HTTPServer):
    endpoints: Endpoints

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("http request failed", exc_info=True, extra={"event": "HttpError"})


class ServiceSurface:
    """A listening socket the supervisor's loop polls; one request handled per readiness."""

    def __init__(self, addr: str, endpoints: Endpoints, allow_remote: bool = False) -> None:
        host, port = parse_addr(addr)
        check_bind(host, endpoints.token, allow_remote)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        _Server.address_family = family
        try:
            self.server = _Server((host, port), _Handler)
        except OSError as exc:
            raise SurfaceConfigError(f"cannot listen on {addr}: {exc.strerror or exc}") from None
        self.server.endpoints = endpoints
        self.server.timeout = 0
        self.address = f"{host}:{self.server.server_address[1]}"

    def fileno(self) -> int:
        """The listening socket, for select()."""
        return self.server.fileno()

    def handle(self) -> None:
        """Serve the pending connection, if any."""
        self.server.handle_request()

    def close(self) -> None:
        """Stop listening."""
        self.server.server_close()
