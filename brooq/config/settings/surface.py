"""Settings of what a supervisor shows: the HTTP surface, its token, and the logs."""

from __future__ import annotations

from typing import Literal

from brooq.config import values as v
from brooq.config.settings.key import DASHBOARD, GLOBAL, SUPERVISE, WORK, Key, KeyTable

LogFormat = Literal["kv", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]


class SurfaceKeys(KeyTable):
    """HTTP_ADDR, HTTP_ALLOW_REMOTE, BROOQ_TOKEN, LOG_FORMAT, LOG_LEVEL and QUEUE_LOG_JOBS."""

    http_addr: Key[str] = Key(
        "HTTP_ADDR",
        v.ADDR,
        "127.0.0.1:8090",
        "Address of /metrics, /healthz and the dashboard (loopback only unless "
        "HTTP_ALLOW_REMOTE; port 0 = any free).",
        section="surface",
        commands=(SUPERVISE, DASHBOARD),
    )
    http_allow_remote: Key[bool] = Key(
        "HTTP_ALLOW_REMOTE",
        v.BOOL,
        "false",
        "Allow a non-loopback HTTP_ADDR (BROOQ_TOKEN then required; every page needs the login).",
        section="surface",
        commands=(SUPERVISE, DASHBOARD),
    )
    http_allowed_hosts: Key[tuple[str, ...] | None] = Key(
        "HTTP_ALLOWED_HOSTS",
        v.HOSTS,
        None,
        "Names the surface may be reached by besides its address (the name of a proxy in "
        "front of it, or of this host): a request whose Host header names anything else is "
        "answered 421 (DNS rebinding), but /healthz and /metrics. Empty: the address alone "
        "(and localhost for a loopback address, any IP for 0.0.0.0 or ::).",
        section="surface",
        example="brooq.internal,worker-1.example.com",
        commands=(SUPERVISE, DASHBOARD),
    )
    token: Key[str | None] = Key(
        "BROOQ_TOKEN",
        v.TOKEN,
        None,
        "Bearer token of the job endpoints and the dashboard's login (secret; at least 32 bytes, "
        "e.g. `openssl rand -hex 32`). Unset: those endpoints are off and the dashboard is "
        "read-only; /metrics and /healthz never need it.",
        section="secrets",
        secret=True,
    )
    log_format: Key[LogFormat] = Key(
        "LOG_FORMAT",
        v.choice("kv", "json"),
        "kv",
        "Log lines as kv (key=value) or json.",
        section="surface",
        commands=(GLOBAL,),
    )
    log_level: Key[LogLevel] = Key(
        "LOG_LEVEL",
        v.choice("debug", "info", "warning", "error"),
        "info",
        "debug, info, warning or error.",
        section="surface",
        commands=(GLOBAL,),
    )
    log_jobs: Key[bool] = Key(
        "QUEUE_LOG_JOBS",
        v.BOOL,
        "false",
        "Log every job at INFO (JobClaimed, JobDone); off, done jobs are logged at DEBUG "
        "(their row and the metrics record them) and failures are logged either way.",
        section="surface",
        commands=(SUPERVISE, WORK),
    )
