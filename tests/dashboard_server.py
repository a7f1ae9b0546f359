"""A dashboard served in-process on a free loopback port, for the HTTP and browser tests."""

from __future__ import annotations

import http.client
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlencode

from brooq.surface.dashboard import Dashboard
from brooq.surface.dashboard.ports import close_ports, postgres_ports
from brooq.surface.router import Router
from brooq.surface.server import SurfaceServer

TOKEN = "test-token-" + "x" * 32


@dataclass
class Answer:
    """One HTTP answer."""

    status: int
    headers: http.client.HTTPMessage
    body: str


@dataclass
class Served:
    """A running dashboard: its address, and a small client."""

    address: str

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.address}"

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """One request (a form is sent urlencoded); redirects are not followed."""
        host, port = self.address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        body = urlencode(form).encode() if form is not None else None
        sent = dict(headers or {})
        if form is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            return Answer(response.status, response.headers, response.read().decode())
        finally:
            conn.close()


@contextmanager
def serve_dashboard(
    dsn: str, token: str | None, allowed_hosts: Sequence[str] = ()
) -> Iterator[Served]:
    """Serve the dashboard for ``dsn`` until the block ends."""
    ports = postgres_ports(dsn)
    server = SurfaceServer(
        "127.0.0.1:0",
        Dashboard(ports, token, where="test").routes(Router()),
        allowed_hosts=allowed_hosts,
    )
    server.start()
    try:
        yield Served(server.address)
    finally:
        server.close()
        close_ports(ports)
