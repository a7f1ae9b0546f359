"""``brooq dashboard``: the web dashboard alone, for hosts that run no supervisor."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Any

from brooq.cli.common import add_setting_flags, require_dsn
from brooq.config import Settings
from brooq.config.settings import DASHBOARD


def register(sub: Any) -> None:
    """Add the dashboard command."""
    p = sub.add_parser(
        "dashboard",
        help="serve the web dashboard at /ui (no supervisor needed)",
        description="Serve the dashboard on HTTP_ADDR until SIGTERM or Ctrl-C. "
        "Read-only unless BROOQ_TOKEN is set.",
    )
    add_setting_flags(p, DASHBOARD)
    p.set_defaults(func=cmd_dashboard, needs_schema=False)  # checked in cmd_dashboard


def cmd_dashboard(args: argparse.Namespace, settings: Settings) -> int:
    """Serve until stopped; exit 2 on an unmigrated database or an unusable address."""
    from brooq.postgres.preflight import check_schema
    from brooq.surface.dashboard import Dashboard
    from brooq.surface.dashboard.ports import close_ports, postgres_ports
    from brooq.surface.guard import check_bind, parse_addr
    from brooq.surface.router import Router
    from brooq.surface.server import SurfaceServer
    from brooq.vocabulary import StoreUnavailable

    dsn = require_dsn(settings)
    try:
        check_schema(dsn)
    except StoreUnavailable as exc:  # the pages say so and recover when it answers
        print(f"brooq: warning: {exc}", file=sys.stderr)
    addr = settings.http_addr
    check_bind(parse_addr(addr)[0], settings.token, settings.http_allow_remote)
    ports = postgres_ports(dsn)
    dashboard = Dashboard(
        ports, settings.token, where="brooq dashboard", remote=settings.http_allow_remote
    )
    server = SurfaceServer(
        addr, dashboard.routes(Router()), allowed_hosts=settings.http_allowed_hosts or ()
    )
    stop = threading.Event()

    def stop_serving(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, stop_serving) for s in (signal.SIGTERM, signal.SIGINT)}
    server.start()
    mode = "pages need the login" if settings.token else "read-only (no BROOQ_TOKEN)"
    print(
        f"brooq dashboard on http://{server.address}/ui ({mode}); Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        server.close()
        close_ports(ports)
    return 0
