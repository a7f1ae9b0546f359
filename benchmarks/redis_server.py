"""A private Redis for the Celery peer: Debian's redis-server on a free loopback port.

Installed with ``apt-get install -y redis-server`` when missing (as root;
``RUNLEVEL=1`` so that the package does not start a system-wide server). Each
Celery drain starts its own instance (127.0.0.1, a free port, its files in a
temporary directory, no snapshots and no append-only file: nothing is
written to disk during the drain, Redis's fastest setting) and stops it
afterwards, so its CPU is that drain's alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGE = "redis-server"
START_TIMEOUT_S = 10.0


def executable() -> str | None:
    """The redis-server binary, if installed."""
    found = shutil.which("redis-server")
    if found:
        return found
    debian = Path("/usr/bin/redis-server")
    return str(debian) if debian.exists() else None


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "RUNLEVEL": "1"}
    return subprocess.run(
        ["apt-get", *args], capture_output=True, text=True, timeout=900, env=env, check=False
    )


def ensure_installed() -> str:
    """The redis-server binary, installed from Debian's packages if missing; raises with why not."""
    found = executable()
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError(f"{PACKAGE} is not installed and only root may apt-get install it")
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"{PACKAGE} is not installed and there is no apt-get")
    done = _apt("install", "-y", "-q", PACKAGE)
    if done.returncode != 0:
        _apt("update", "-q")  # the package lists may be missing or stale
        done = _apt("install", "-y", "-q", PACKAGE)
    if done.returncode != 0:
        raise RuntimeError(f"apt-get install -y {PACKAGE} failed:\n{done.stderr[-1500:]}")
    found = executable()
    if found is None:
        raise RuntimeError(f"apt-get installed {PACKAGE} but redis-server is not on PATH")
    return found


def version(binary: str) -> str:
    """``Redis server v=7.0.15 …`` → ``7.0.15``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    return out.strip() or "unknown"


def free_port() -> int:
    """A loopback port nobody listens on now (the caller retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One private redis-server process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        """Its process id."""
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> RedisServer:
        """Start it on a free port and wait until it answers PING."""
        binary = executable()
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        for _ in range(3):
            self.port = free_port()
            data = self.workdir / f"redis-{self.port}"
            data.mkdir(parents=True, exist_ok=True)
            with open(data / "redis.log", "ab") as log:
                self.proc = subprocess.Popen(
                    [
                        binary,
                        "--port",
                        str(self.port),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(data),
                        "--daemonize",
                        "no",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self.ping():
                    return self
                time.sleep(0.05)
            self.stop()
        raise RuntimeError(f"redis-server did not start; see {self.workdir}/redis-*/redis.log")

    def ping(self) -> bool:
        """True when it answers PING."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
