"""sd_notify in a few lines of stdlib: READY, STOPPING, WATCHDOG and STATUS to systemd."""

from __future__ import annotations

import contextlib
import os
import socket
import time


class Notifier:
    """Talks to ``$NOTIFY_SOCKET`` when systemd set one; does nothing otherwise."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        address = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        watched = usec.isdigit() and (not pid or pid == str(os.getpid()))
        # Pet twice per period, so one slow tick never trips the watchdog.
        self.watchdog_every_s = int(usec) / 2e6 if watched else None
        self._last_pet = 0.0
        self.ready_sent = False

    @property
    def next_pet_at(self) -> float | None:
        """When the next WATCHDOG=1 is due (monotonic), or None without a watchdog."""
        if self.watchdog_every_s is None:
            return None
        return self._last_pet + self.watchdog_every_s

    @property
    def enabled(self) -> bool:
        """True when running under a notify-type unit."""
        return bool(self.address)

    def send(self, *fields: str) -> None:
        """Send ``KEY=value`` lines; errors are ignored (systemd may be gone)."""
        if not self.enabled:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
            sock.sendto("\n".join(fields).encode(), self.address)

    def ready(self, status: str) -> None:
        """READY=1, once."""
        if not self.ready_sent:
            self.ready_sent = True
            self.send("READY=1", f"STATUS={status}")

    def reloading(self, status: str) -> None:
        """RELOADING=1 (with MONOTONIC_USEC, as Type=notify-reload wants it)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", f"STATUS={status}")

    def reloaded(self, status: str) -> None:
        """READY=1 again after a reload, whether it succeeded or not."""
        self.send("READY=1", f"STATUS={status}")

    def stopping(self, status: str) -> None:
        """STOPPING=1."""
        self.send("STOPPING=1", f"STATUS={status}")

    def pet(self) -> None:
        """WATCHDOG=1 when it is due; call it from every loop tick."""
        if self.watchdog_every_s is None:
            return
        now = time.monotonic()
        if now - self._last_pet >= self.watchdog_every_s:
            self._last_pet = now
            self.send("WATCHDOG=1")
