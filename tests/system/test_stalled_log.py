"""Issue 22, item 3: a log sink that stalls never stalls the supervisor's loop.

A real supervisor runs with stdout and stderr on one pipe that nobody reads:
once the pipe is full, every line written to it blocks. Two jobs longer than
the lease live on the loop's heartbeats while the supervisor has things to
log (SIGTTIN: one worker more, twice). The loop never waits: /healthz
answers every poll, the long jobs run once, no lease runs out; the lines the
pipe could not take are dropped, and counted in a ``LogLinesDropped`` line
once somebody reads it again (a worker says so with its next line).
"""

from __future__ import annotations

import array
import fcntl
import os
import signal
import subprocess
import termios
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import Supervisor, count, insert_jobs, wait_until
from tests.system.test_slowloris import timed_healthz

pytestmark = [pytest.mark.system, pytest.mark.db]

LONG_JOB_S = 7.0  # more than twice the lease


class PipedSupervisor(Supervisor):
    """A supervisor whose stdout and stderr go to one pipe the test reads only when it wants."""

    def start(self) -> PipedSupervisor:
        self.env_used = self.env()
        self.log_path.touch()  # no log file: the lines are in the pipe
        self.proc = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            env=self.env_used,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def unread(self) -> int:
        """Bytes written to the pipe and not read yet."""
        assert self.proc is not None and self.proc.stdout is not None
        held = array.array("i", [0])
        fcntl.ioctl(self.proc.stdout.fileno(), termios.FIONREAD, held)
        return held[0]


@pytest.mark.timeout(150)
def test_a_stdout_nobody_reads_never_stalls_the_loop(
    pg: psycopg.Connection[Any], dsn: str, tmp_path: Path
) -> None:
    sup = PipedSupervisor(
        dsn,
        tmp_path,
        args=["--workers", "2", "--lease", "3s", "--poll-interval", "100ms"],
        env={"QUEUE_GRACEFUL_TIMEOUT": "1s", "QUEUE_LOG_JOBS": "true"},  # a line per job
    ).start()
    output: list[bytes] = []
    try:
        host, port = sup.env_used["HTTP_ADDR"].rsplit(":", 1)
        wait_until(lambda: timed_healthz(host, int(port))[1] == 200, 20, "/healthz 200")
        insert_jobs(pg, "work", [None] * 400)  # two lines each: past the pipe's 64 KiB
        wait_until(lambda: sup.unread() >= 60_000, 30, "the pipe to fill up")
        long_jobs = insert_jobs(pg, "work", [{"sleep": LONG_JOB_S}] * 2)
        wait_until(lambda: count(pg, "state = 'processing'") == 2, 10, "the long jobs to run")
        polls = []
        began = time.monotonic()
        for signum in (signal.SIGTTIN, signal.SIGTTIN):  # the supervisor logs, into the full pipe
            sup.send(signum)
            time.sleep(0.2)
        while time.monotonic() - began < LONG_JOB_S + 2:
            seconds, status = timed_healthz(host, int(port))
            polls.append((round(time.monotonic() - began, 1), round(seconds, 3), status))
            time.sleep(max(0.0, 0.5 - seconds))
        expired = count(pg, "expirations > 0 OR attempts > 1")
        long_done = count(pg, "id = ANY(%s) AND state = 'done'", [long_jobs])

        reader = threading.Thread(target=_drain, args=(sup, output), daemon=True)
        reader.start()  # the sink takes lines again: what was held, then the count of the lost
        insert_jobs(pg, "work", [None] * 40)  # the workers that dropped lines log again
        deadline = time.monotonic() + 15
        while b'"LogLinesDropped"' not in b"".join(output) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        code = sup.stop(timeout=20)
    problems = []
    if any(status != 200 or seconds >= 1.0 for _, seconds, status in polls):
        problems.append(f"/healthz failed or slow: {polls}")
    if expired or long_done != 2:
        problems.append(f"{expired} jobs expired or ran twice; {long_done} of 2 long jobs done")
    if b'"LogLinesDropped"' not in b"".join(output):
        problems.append("no LogLinesDropped line once the pipe was read again")
    if code != 0:
        problems.append(f"exit code {code}")
    assert not problems, "; ".join(problems)


def _drain(sup: PipedSupervisor, into: list[bytes]) -> None:
    assert sup.proc is not None and sup.proc.stdout is not None
    fd = sup.proc.stdout.fileno()
    while chunk := os.read(fd, 1 << 16):
        into.append(chunk)
