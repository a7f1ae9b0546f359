"""sd_notify as a Type=notify unit sees it: a real supervisor talking to a real $NOTIFY_SOCKET.

The test plays systemd: it binds an AF_UNIX datagram socket, starts
``brooq supervise`` with NOTIFY_SOCKET, WATCHDOG_USEC=1 s and no
WATCHDOG_PID, and reads what arrives. Every wait is bounded.
"""

from __future__ import annotations

import itertools
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.system.harness import Supervisor, title

pytestmark = [pytest.mark.system, pytest.mark.db]

WATCHDOG_USEC = 1_000_000


@dataclass
class Message:
    """One datagram: its KEY=value fields, when it came, and the workers running then."""

    fields: dict[str, str]
    at: float
    workers: list[int]


class NotifySocket:
    """The systemd side of sd_notify: a bound AF_UNIX SOCK_DGRAM socket."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "notify"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.messages: list[Message] = []

    def receive(self, timeout: float, sup: Supervisor | None = None) -> Message | None:
        """The next datagram within ``timeout`` s (None if none came)."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return None
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        # Who runs right now: taken as the message arrives, before anything can change.
        workers = sup.children() if sup is not None else []
        message = Message(fields, time.monotonic(), workers)
        self.messages.append(message)
        return message

    def wait_for(self, key: str, timeout: float, sup: Supervisor | None = None) -> Message:
        """Read until a message with ``key`` arrives; AssertionError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self.receive(left, sup)
            if message is not None and key in message.fields:
                return message
        seen = [m.fields for m in self.messages]
        raise AssertionError(f"no {key} within {timeout}s; received {seen}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    # A short path of our own: AF_UNIX paths are limited to 107 bytes, tmp_path can be longer.
    directory = Path(tempfile.mkdtemp(prefix="brooq-notify-"))
    sock = NotifySocket(directory)
    yield sock
    sock.close()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def no_watchdog_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """WATCHDOG_PID unset, as when systemd watches the main process it started."""
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_watchdog_pid")
def test_ready_after_the_workers_run_watchdog_while_alive_stopping_on_sigterm(
    supervise: Callable[..., Supervisor],
    notify_socket: NotifySocket,
) -> None:
    sup = supervise(
        "--workers",
        "2",
        "--http-addr",
        "127.0.0.1:0",
        "--poll-interval",
        "200ms",
        "--graceful-timeout",
        "5s",
        env={"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)},
    )

    ready = notify_socket.wait_for("READY", timeout=30, sup=sup)
    assert ready.fields["READY"] == "1"
    assert "STATUS" in ready.fields
    # READY=1 means every worker process has booted, not merely been forked.
    assert len(ready.workers) == 2, ready.workers
    assert all(title(pid).startswith("brooq worker") for pid in ready.workers)
    assert len(sup.events("WorkerStarted")) >= 2
    assert not any("STOPPING" in m.fields for m in notify_socket.messages)

    # WATCHDOG=1, again and again: the loop wakes for the pet at half the period, so no gap
    # comes near the period systemd would kill at.
    pets = [notify_socket.wait_for("WATCHDOG", timeout=5, sup=sup) for _ in range(4)]
    assert all(p.fields["WATCHDOG"] == "1" for p in pets)
    gaps = [b.at - a.at for a, b in itertools.pairwise(pets)]
    assert max(gaps) < WATCHDOG_USEC / 1e6, gaps
    assert sum(1 for m in notify_socket.messages if "READY" in m.fields) == 1

    sup.send(signal.SIGTERM)
    stopping = notify_socket.wait_for("STOPPING", timeout=10)
    assert stopping.fields["STOPPING"] == "1"
    assert sup.wait_exit(timeout=30) == 0
    assert sum(1 for m in notify_socket.messages if "READY" in m.fields) == 1


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_watchdog_pid")
def test_watchdog_pets_come_within_the_period_systemd_enforces(
    supervise: Callable[..., Supervisor],
    notify_socket: NotifySocket,
) -> None:
    """systemd kills a unit that does not pet within WATCHDOG_USEC: no gap may reach it."""
    usec = 3_000_000
    sup = supervise(
        "--workers",
        "1",
        "--http-addr",
        "127.0.0.1:0",
        "--graceful-timeout",
        "5s",
        env={"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": str(usec)},
    )
    notify_socket.wait_for("READY", timeout=30, sup=sup)
    pets = [notify_socket.wait_for("WATCHDOG", timeout=usec / 1e6, sup=sup) for _ in range(3)]
    gaps = [b.at - a.at for a, b in itertools.pairwise(pets)]
    assert max(gaps) < usec / 1e6, gaps
    sup.send(signal.SIGTERM)
    notify_socket.wait_for("STOPPING", timeout=10)
    assert sup.wait_exit(timeout=30) == 0


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_watchdog_pid")
def test_no_watchdog_pets_when_systemd_watches_another_pid(
    supervise: Callable[..., Supervisor],
    notify_socket: NotifySocket,
) -> None:
    """WATCHDOG_PID names the process systemd watches; any other process must not pet."""
    sup = supervise(
        "--workers",
        "1",
        "--http-addr",
        "127.0.0.1:0",
        "--graceful-timeout",
        "5s",
        env={
            "NOTIFY_SOCKET": str(notify_socket.path),
            "WATCHDOG_USEC": str(WATCHDOG_USEC),
            "WATCHDOG_PID": "1",
        },
    )
    notify_socket.wait_for("READY", timeout=30, sup=sup)
    deadline = time.monotonic() + 2.5  # five pet periods
    while (left := deadline - time.monotonic()) > 0:
        notify_socket.receive(left)
    assert not [m for m in notify_socket.messages if "WATCHDOG" in m.fields]
    sup.send(signal.SIGTERM)
    notify_socket.wait_for("STOPPING", timeout=10)
    assert sup.wait_exit(timeout=30) == 0
