"""HTTP/1.1 on one socket, bounded in time and size: read one request, write one response.

Every read recomputes the socket timeout from ONE deadline for the whole
request (request line, headers and body), so a client that trickles a byte a
second is cut off when the deadline passes, not when it stops sending. Every
write is bounded the same way. One request per connection (``Connection:
close``): the surface serves probes and a small dashboard, not browsers'
keep-alive pipelines, and a connection that outlives its request would hold
a slot for nothing.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 100
MAX_BODY_BYTES = 1024 * 1024
_RECV = 64 * 1024
_METHOD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


class HttpError(Exception):
    """The request cannot be served as sent; ``status`` says why (4xx/5xx)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class DeadlinePassed(HttpError):
    """The client did not send its request (or read the answer) before the deadline."""

    def __init__(self, what: str) -> None:
        super().__init__(408, f"{what} not complete before the deadline")


class PeerGone(Exception):
    """The client closed the connection (or it was shut down) before the request was whole."""


@dataclass(frozen=True)
class Request:
    """One parsed request. Header names are lower case; ``params`` are a route's named groups."""

    method: str
    target: str
    path: str
    query: dict[str, list[str]]
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    params: dict[str, str] = field(default_factory=dict)
    client: str = ""

    def header(self, name: str, default: str | None = None) -> str | None:
        """The value of header ``name`` (case-insensitive); the first one when repeated."""
        values = self.header_values(name)
        return values[0] if values else default

    def header_values(self, name: str) -> list[str]:
        """Every value of header ``name``, in order (to refuse duplicates where they matter)."""
        key = name.lower()
        return [v for k, v in self.headers if k == key]

    @property
    def cookies(self) -> dict[str, str]:
        """The ``Cookie`` header as name → value (the first of a repeated name wins)."""
        jar: dict[str, str] = {}
        for line in self.header_values("cookie"):
            for part in line.split(";"):
                name, sep, value = part.strip().partition("=")
                if sep and name and name not in jar:
                    jar[name] = unquote(value.strip().strip('"'))
        return jar

    def form(self) -> dict[str, list[str]]:
        """An ``application/x-www-form-urlencoded`` body as name → values ({} for other types)."""
        kind = (self.header("content-type") or "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            return {}
        return parse_qs(self.body.decode("utf-8", "replace"), keep_blank_values=True)


@dataclass
class Response:
    """What a handler returns. ``headers`` is a list: Set-Cookie may repeat."""

    status: int = 200
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = "text/plain; charset=utf-8"

    @classmethod
    def json(
        cls,
        status: int,
        data: Any,
        headers: list[tuple[str, str]] | None = None,
    ) -> Response:
        """A JSON answer (values JSON cannot encode become strings)."""
        return cls(
            status, json.dumps(data, default=str).encode(), list(headers or []), "application/json"
        )

    @classmethod
    def text(
        cls,
        status: int,
        text: str,
        content_type: str = "text/plain; charset=utf-8",
    ) -> Response:
        """A text answer (HTML too, with ``content_type="text/html; charset=utf-8"``)."""
        return cls(status, text.encode(), [], content_type)

    def encode(self, head_only: bool = False) -> bytes:
        """Status line, headers and body, to send (no Server header: nothing to fingerprint)."""
        try:
            reason = HTTPStatus(self.status).phrase
        except ValueError:
            reason = "Status"
        lines = [
            f"HTTP/1.1 {self.status} {reason}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
            "Cache-Control: no-store",
            "X-Content-Type-Options: nosniff",
        ]
        lines += [
            f"{name}: {value}"
            for name, value in self.headers
            if "\r" not in value and "\n" not in value
        ]  # no header injection
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        return head if head_only else head + self.body


def _remaining(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlinePassed(what)
    return left


def _recv(sock: socket.socket, deadline: float, what: str) -> bytes:
    """One recv whose timeout is what is left of the request's deadline."""
    sock.settimeout(_remaining(deadline, what))
    try:
        chunk = sock.recv(_RECV)
    except TimeoutError:
        raise DeadlinePassed(what) from None
    except OSError as exc:
        raise PeerGone(str(exc)) from None
    if not chunk:
        raise PeerGone("the client closed the connection")
    return chunk


def read_request(
    sock: socket.socket, deadline: float, client: str = "", max_body: int = MAX_BODY_BYTES
) -> Request:
    """Read one request before ``deadline`` (time.monotonic()); HttpError when it is not valid."""
    buf = bytearray()
    while (end := buf.find(b"\r\n\r\n")) < 0:
        if len(buf) > MAX_HEAD_BYTES:
            raise HttpError(431, "request head too large")
        buf += _recv(sock, deadline, "request head")
    if end > MAX_HEAD_BYTES:
        raise HttpError(431, "request head too large")
    method, target, headers = _parse_head(bytes(buf[:end]))
    body = bytes(buf[end + 4 :])
    length = _content_length(headers)
    if length > max_body:
        raise HttpError(413, f"request body larger than {max_body} bytes")
    while len(body) < length:
        body += _recv(sock, deadline, "request body")
    parts = urlsplit(target)
    return Request(
        method=method,
        target=target,
        path=unquote(parts.path) or "/",
        query=parse_qs(parts.query, keep_blank_values=True),
        headers=headers,
        body=body[:length],
        client=client,
    )


def _parse_head(head: bytes) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    text = head.decode("latin-1")
    request_line, *lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _METHOD_CHARS:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are served")
    if not target.startswith("/"):
        raise HttpError(400, "the request target must be a path")
    if len(lines) > MAX_HEADERS:
        raise HttpError(431, "too many headers")
    headers = []
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[0] in " \t":
            raise HttpError(400, "malformed header line")  # obs-fold and spaces before ':'
        headers.append((name.lower(), value.strip(" \t")))
    return method, target, tuple(headers)


def _content_length(headers: tuple[tuple[str, str], ...]) -> int:
    if any(k == "transfer-encoding" for k, _ in headers):
        raise HttpError(411, "chunked bodies are not accepted; send Content-Length")
    values = {v for k, v in headers if k == "content-length"}
    if not values:
        return 0
    if len(values) > 1 or not next(iter(values)).isdigit():
        raise HttpError(400, "bad Content-Length")
    return int(next(iter(values)))


def send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    """Send ``data`` before ``deadline``; DeadlinePassed or PeerGone otherwise."""
    view = memoryview(data)
    while view:
        sock.settimeout(_remaining(deadline, "response"))
        try:
            sent = sock.send(view)
        except TimeoutError:
            raise DeadlinePassed("response") from None
        except OSError as exc:
            raise PeerGone(str(exc)) from None
        view = view[sent:]


def send_nowait(sock: socket.socket, data: bytes) -> None:
    """Best effort, never blocking: for refusals to clients that may not read at all."""
    try:
        sock.setblocking(False)
        sock.send(data)
    except OSError:
        pass
