"""Run ``brooq supervise`` as a real process and watch it from outside: /proc, its log, the rows.

Everything here is bounded in time: ``wait_until`` polls with a deadline,
``Supervisor.stop`` sends SIGTERM, waits at most its timeout, then SIGKILLs
the whole process group and every child pid it ever saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import psycopg

import brooq

APPS = Path(__file__).resolve().parent / "apps"
# The supervisor runs the same brooq as the tests (this checkout), not another install.
BROOQ_ROOT = Path(brooq.__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join([str(APPS), str(BROOQ_ROOT)])
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
T = TypeVar("T")

# Settings that must not leak from the developer's environment into the supervisor.
_SCRUBBED_PREFIXES = ("QUEUE_", "BROOQ_", "LOG_")
_SCRUBBED = {"DATABASE_URL", "HTTP_ADDR", "CREDENTIALS_DIRECTORY", "PYTHONPATH"}


def wait_until(
    predicate: Callable[[], T | Literal[False] | None],
    timeout: float,
    what: str = "",
    interval: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError after."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


# --- /proc ----------------------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of ``pid``, or None when there is no such process."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def children_of(ppid: int) -> list[int]:
    """Live (non-zombie) children of ``ppid``, sorted."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None and stat[1] == ppid and stat[0] not in ("Z", "X"):
                found.append(int(entry))
    return sorted(found)


def title(pid: int) -> str:
    """What ``ps -o args`` shows for ``pid`` (setproctitle rewrites it); '' when gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc/<pid>/statm; 0 when gone."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError, ValueError):
        return 0


def free_port() -> int:
    """A TCP port nothing listens on right now (for HTTP_ADDR)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- rows ------------------------------------------------------------------------------------


def states(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Rows per state."""
    return {s: n for s, n in conn.execute("SELECT state, count(*) FROM job GROUP BY state")}


def count(conn: psycopg.Connection[Any], where: str = "true", params: Sequence[Any] = ()) -> int:
    """Rows of ``job`` matching ``where``."""
    row = conn.execute(f"SELECT count(*) FROM job WHERE {where}", params).fetchone()
    assert row is not None
    return int(row[0])


def job(conn: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    """The row of one job as a dict."""
    cur = conn.execute(
        "SELECT id::text, topic, state, attempts, last_error, locked_by, locked_until "
        "FROM job WHERE id = %s",
        (job_id,),
    )
    row = cur.fetchone()
    assert row is not None, f"no job {job_id}"
    names = [d.name for d in cur.description or []]
    return dict(zip(names, row, strict=True))


def insert_jobs(conn: psycopg.Connection[Any], topic: str, payloads: Sequence[Any]) -> list[str]:
    """Enqueue jobs with plain SQL, in order (ids are UUIDv7); NOTIFY the workers. Their ids."""
    ids = [
        str(r[0])
        for r in conn.execute(
            "INSERT INTO job (topic, payload) SELECT %s, p FROM unnest(%s::jsonb[]) "
            "WITH ORDINALITY AS t(p, n) ORDER BY n RETURNING id",
            (topic, [json.dumps(p) for p in payloads]),
        )
    ]
    conn.execute("SELECT pg_notify('brooq_job', %s)", (topic,))
    return ids


def all_terminal(conn: psycopg.Connection[Any]) -> bool:
    """True when no job is pending, processing or failed."""
    return count(conn, "state IN ('pending', 'processing', 'failed')") == 0


# --- the supervisor --------------------------------------------------------------------------


class Supervisor:
    """One ``python -m brooq.cli supervise`` process, in its own session (process group)."""

    def __init__(
        self,
        dsn: str,
        workdir: Path,
        app: str = "sysapp:queue",
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        name: str = "supervisor",
    ) -> None:
        self.dsn, self.workdir, self.app = dsn, workdir, app
        self.args, self.extra_env = list(args), dict(env or {})
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self.seen: set[int] = set()
        self._offset = 0
        self._events: list[dict[str, Any]] = []
        self.env_used: dict[str, str] = {}
        """The environment the process was started with (HTTP_ADDR and all)."""

    # lifecycle

    def env(self) -> dict[str, str]:
        """The supervisor's environment: ours minus brooq settings, plus the test's."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)
        }
        env.update(
            {
                "DATABASE_URL": self.dsn,
                "PYTHONPATH": PYTHONPATH,
                "LOG_FORMAT": "json",
                "LOG_LEVEL": "info",
                "PYTHONUNBUFFERED": "1",
                "HTTP_ADDR": f"127.0.0.1:{free_port()}",
            }
        )
        env.update(self.extra_env)
        return env

    def command(self) -> list[str]:
        """The command line."""
        return [sys.executable, "-m", "brooq.cli", "supervise", "--app", self.app, *self.args]

    def start(self) -> Supervisor:
        """Start the process (stdout and stderr go to the log file)."""
        self.env_used = self.env()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.workdir,
                env=self.env_used,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        """The supervisor's pid (also its process group id)."""
        assert self.proc is not None
        return self.proc.pid

    def exited(self) -> bool:
        """True once the process ended; it is NOT reaped (its pid and group stay reserved)."""
        if self.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def reap(self) -> int:
        """Collect the exit status of an ended process; its exit code."""
        assert self.proc is not None
        if self.returncode is None:
            self.returncode = self.proc.wait(timeout=5)
        return self.returncode

    def wait_exit(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for the process to end; its exit code."""
        wait_until(self.exited, timeout, f"supervisor {self.pid} to exit")
        return self.reap()

    def send(self, signum: int) -> None:
        """Send ``signum`` to the supervisor only (not its group)."""
        os.kill(self.pid, signum)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait ≤ ``timeout`` s, then SIGKILL; always kill every leftover. Exit code."""
        if self.proc is None:
            return None
        if not self.exited():
            with contextlib.suppress(ProcessLookupError):
                self.send(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while not self.exited() and time.monotonic() < deadline:
                time.sleep(0.05)
        self.kill_leftovers()
        return self.reap()

    def kill_leftovers(self) -> None:
        """SIGKILL the supervisor's process group and every worker pid ever seen that still runs."""
        if self.proc is None:
            return
        if self.returncode is None:  # not reaped: the group id cannot have been reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self.events()  # learn the pids of WorkerStarted
        for pid in sorted(self.seen):
            if alive(pid) and title(pid).startswith("brooq"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.reap()

    # children

    def children(self) -> list[int]:
        """The live worker processes (children of the supervisor)."""
        pids = children_of(self.pid)
        self.seen.update(pids)
        return pids

    def titles(self) -> dict[int, str]:
        """pid → process title of every live child."""
        return {pid: title(pid) for pid in self.children()}

    def wait_children(
        self, n: int, timeout: float = 15.0, exclude: Sequence[int] = ()
    ) -> list[int]:
        """Wait until exactly ``n`` children run (none of them in ``exclude``); their pids."""

        def check() -> list[int] | None:
            pids = self.children()
            ok = len(pids) == n and not set(pids) & set(exclude)
            return pids if ok and all(title(p).startswith("brooq worker") for p in pids) else None

        return wait_until(check, timeout, f"{n} children of supervisor {self.pid}")

    def child_running(self, job_id: str) -> int | None:
        """The pid of the child whose title shows it runs ``job_id``."""
        for pid, text in self.titles().items():
            if job_id in text:
                return pid
        return None

    # log

    def events(self, name: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        """The JSON log lines so far (parent and children), filtered by event name and fields."""
        with open(self.log_path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                self._events.append(record)
                if record.get("event") == "WorkerStarted" and isinstance(record.get("pid"), int):
                    self.seen.add(record["pid"])
        return [
            e
            for e in self._events
            if (name is None or e.get("event") == name)
            and all(e.get(k) == v for k, v in fields.items())
        ]

    def wait_event(self, name: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """Wait for the first log event ``name`` with ``fields``; that event."""
        found = wait_until(
            lambda: self.events(name, **fields), timeout, f"log event {name} {fields or ''}"
        )
        return found[0]

    def log_tail(self, lines: int = 80) -> str:
        """The last lines of the log, for a failing test's report."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def run_cli(
    dsn: str, workdir: Path, *args: str, timeout: float = 30.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m brooq.cli ARGS`` with the test database; its completed process."""
    extra = env or {}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)
    }
    env.update({"DATABASE_URL": dsn, "PYTHONPATH": PYTHONPATH, **extra})
    return subprocess.run(
        [sys.executable, "-m", "brooq.cli", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
