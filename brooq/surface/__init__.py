"""The HTTP surface: a small threaded server, its routes, and the supervisor's endpoints.

- :mod:`brooq.surface.wire`: Request/Response, one request per connection,
  read and written under deadlines.
- :mod:`brooq.surface.router`: exact and pattern routes → handlers.
- :mod:`brooq.surface.server`: :class:`SurfaceServer`, off the supervisor's
  loop, with a total deadline per request and a connection cap.
- :mod:`brooq.surface.guard`: addresses, bearer tokens, Host names, SurfaceConfigError.
- :mod:`brooq.surface.service`: /metrics, /healthz and /jobs for a supervisor.

Handlers run in the server's threads: they must be thread-safe.
"""

from brooq.surface.guard import SurfaceConfigError, check_bind, parse_addr, refuse_unless_bearer
from brooq.surface.router import Handler, Router
from brooq.surface.server import Limits, SurfaceServer
from brooq.surface.service import HealthBoard, ServiceEndpoints, ServiceSurface, service_routes
from brooq.surface.wire import Request, Response

__all__ = [
    "Handler",
    "HealthBoard",
    "Limits",
    "Request",
    "Response",
    "Router",
    "ServiceEndpoints",
    "ServiceSurface",
    "SurfaceConfigError",
    "SurfaceServer",
    "check_bind",
    "parse_addr",
    "refuse_unless_bearer",
    "service_routes",
]
