"""The web dashboard at ``/ui``: overview, job list, job page, and token-guarded actions.

Served as routes of the surface's HTTP server (brooq.surface.server), by a
supervisor next to /metrics or alone by ``brooq dashboard``. Server-rendered
with Jinja2 (autoescape everywhere); every asset ships in the package.
"""

from __future__ import annotations

from brooq.surface.dashboard.views import Dashboard, DashboardPorts

__all__ = ["Dashboard", "DashboardPorts"]
