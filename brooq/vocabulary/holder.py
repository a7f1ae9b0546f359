"""Who holds a claimed job: ``hostname:pid:<random>``, made once per process start."""

from __future__ import annotations

import os
import secrets
import socket

_made: dict[int, str] = {}


def holder_id() -> str:
    """This process's holder identity, the same for every call until it forks.

    The random part, made once per process start, keeps two processes apart
    that share a hostname and a pid (containers with host networking, PID
    namespaces): one cannot extend, release or settle the other's jobs.
    A forked child gets its own (its pid differs).
    """
    pid = os.getpid()
    if pid not in _made:
        _made.clear()
        _made[pid] = f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}"
    return _made[pid]


def holder_host(holder: str) -> str:
    """The hostname part of a holder identity."""
    return holder.rsplit(":", 2)[0]
