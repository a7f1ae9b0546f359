"""brooq under the sandbox of systemd/brooq.service: the hardening must not break Python.

systemd is not PID 1 here, so sandbox.py applies the kernel side of the unit's
settings by hand (seccomp @system-service, MemoryDenyWriteExecute, the address
families, no capabilities, NoNewPrivileges, UMask) and execs brooq. A
supervisor then does its whole job under them: fork workers, run handlers with
soft timeouts, settle in transactions, replace a crashed child, reload on HUP,
serve /metrics, stop cleanly. Every wait is bounded.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import (
    Supervisor,
    count,
    insert_jobs,
    run_cli,
    wait_until,
)

pytestmark = [pytest.mark.system, pytest.mark.db]

SANDBOX = Path(__file__).resolve().parent / "sandbox.py"
SANDBOXED = [sys.executable, str(SANDBOX), "--", sys.executable]


class SandboxedSupervisor(Supervisor):
    """``brooq supervise`` started through sandbox.py."""

    def command(self) -> list[str]:
        return [*SANDBOXED, *super().command()[1:]]


def sandboxed(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDBOXED, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_sandbox_bites() -> None:
    """The emulation is real: what the unit forbids fails inside it."""
    done = sandboxed(
        "import ctypes, errno, mmap, socket\n"
        "try:\n"
        "    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "    print('wx-mapped')\n"
        "except OSError:\n"
        "    print('wx-refused')\n"
        "try:\n"
        "    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno])\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        # ptrace is in @debug, not in @system-service
        "print(libc.ptrace(0, 0, 0, 0), errno.errorcode[ctypes.get_errno()])\n"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapBnd')][0])\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["wx-refused", "EAFNOSUPPORT", "-1", "EPERM", "0000000000000000"]


def test_migrate_runs_sandboxed(empty_dsn: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": empty_dsn, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [*SANDBOXED, "-m", "brooq.cli", "migrate", "up"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT to_regclass('job') IS NOT NULL").fetchone() == (True,)


@pytest.mark.timeout(120)
def test_a_supervisor_does_its_whole_job_sandboxed(
    dsn: str,
    pg: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    pg.execute("CREATE TABLE handled (job_id uuid NOT NULL UNIQUE)")
    sup = SandboxedSupervisor(
        dsn,
        tmp_path,
        args=["--workers", "2", "--poll-interval", "200ms", "--graceful-timeout", "5s"],
    )
    try:
        sup.start()
        sup.wait_children(2, timeout=30)
        http = sup.wait_event("SupervisorStarted", timeout=10)["http"]

        done_ids = insert_jobs(pg, "work", [{"record": True}] * 20)
        timed_out = insert_jobs(pg, "hung", [{"loop": 30}])  # 1 s soft timeout: SIGALRM
        crashed = insert_jobs(pg, "poison", [{"crash": "exit1"}])  # children die, get replaced
        wait_until(
            lambda: (
                count(pg, "state = 'done'") == 20
                and count(pg, "id = %s AND state = 'dead'", crashed) == 1
                and count(pg, "id = %s AND last_error IS NOT NULL", timed_out) == 1
            ),
            60,
            "20 done, the crashing job dead, the slow one timed out",
        )
        assert count(pg, "state = 'done'") == 20
        assert pg.execute("SELECT count(*) FROM handled").fetchone() == (20,)
        assert {str(r[0]) for r in pg.execute("SELECT job_id FROM handled")} == set(done_ids)
        row = pg.execute("SELECT last_error FROM job WHERE id = %s", timed_out).fetchone()
        assert row is not None and "AttemptTimedOut" in (row[0] or "")

        body = urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()
        assert 'brooq_settle_total{outcome="done",topic="work"} 20.0' in body

        before = set(sup.wait_children(2, timeout=30))
        sup.send(signal.SIGHUP)
        sup.wait_children(2, timeout=30, exclude=sorted(before))

        cli = run_cli(dsn, tmp_path, "status")
        assert cli.returncode == 0, cli.stderr

        sup.send(signal.SIGTERM)
        assert sup.wait_exit(timeout=30) == 0
        assert "SIGSYS" not in sup.log_tail(400)
    finally:
        sup.stop(timeout=10)
