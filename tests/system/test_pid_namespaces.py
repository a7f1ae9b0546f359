"""Holder identity across PID namespaces: two supervisors, each PID 1 of its own namespace
(``unshare --pid --fork --mount-proc``, as containers sharing a hostname would run them), so
their holders share ``hostname:1`` and their workers have equal PIDs. Only the random part of
the holder keeps them apart; killing a worker of one must not touch the other's jobs.

Needs root (unshare of a PID namespace), as CI has; it fails rather than skips without it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import (
    Supervisor,
    alive,
    children_of,
    insert_jobs,
    job,
    title,
    wait_until,
)

pytestmark = [pytest.mark.system, pytest.mark.db]

ARGS = (
    "--workers",
    "2",
    "--prefetch",
    "0",
    "--lease",
    "3s",
    "--poll-interval",
    "200ms",
    "--graceful-timeout",
    "3s",
)


def ns_pid(pid: int) -> int:
    """The pid of ``pid`` inside its own (innermost) PID namespace, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError(f"no NSpid line for {pid}")


class NamespacedSupervisor(Supervisor):
    """``brooq supervise`` as PID 1 of a new PID namespace, watched from the root namespace.

    ``pid`` stays the ``unshare`` process (the process group, what is waited for);
    ``inner`` is the supervisor's pid as seen here. The pids its log names are those of
    its namespace, so only pids found in /proc here are ever signalled.
    """

    def command(self) -> list[str]:
        return ["unshare", "--pid", "--fork", "--mount-proc", *super().command()]

    def inner(self) -> int:
        """The supervisor's pid in the root namespace (the child of ``unshare``)."""
        found: list[int] = wait_until(lambda: children_of(self.pid), 10, "unshare's child")
        return found[0]

    def children(self) -> list[int]:
        pids = children_of(self.inner())
        self.workers.update(pids)
        return pids

    def send(self, signum: int) -> None:
        os.kill(self.inner(), signum)

    def kill_leftovers(self) -> None:
        if self.proc is None:
            return
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        for pid in sorted(self.workers):
            if alive(pid) and title(pid).startswith("brooq"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.reap()

    workers: set[int]

    def start(self) -> NamespacedSupervisor:
        self.workers = set()
        super().start()
        return self


@pytest.fixture
def namespaced(dsn: str, tmp_path: Path) -> Any:
    """``namespaced(name)`` starts a NamespacedSupervisor; all are stopped at teardown."""
    started: list[NamespacedSupervisor] = []

    def start(name: str) -> NamespacedSupervisor:
        sup = NamespacedSupervisor(dsn, tmp_path, args=ARGS, name=name)
        started.append(sup)
        return sup.start()

    yield start
    for sup in started:
        sup.stop(timeout=20)


def holders(pg: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """Running job ids per holder."""
    found: dict[str, list[str]] = {}
    for job_id, holder in pg.execute(
        "SELECT id::text, locked_by FROM job WHERE state = 'processing' ORDER BY id"
    ):
        found.setdefault(holder, []).append(job_id)
    return found


@pytest.mark.timeout(90)
def test_a_worker_killed_in_one_namespace_leaves_the_other_supervisors_jobs_alone(
    pg: psycopg.Connection[Any], namespaced: Any
) -> None:
    assert os.geteuid() == 0, "a PID namespace needs root (CI runs the suite as root)"
    a, b = namespaced("a"), namespaced("b")
    a_kids, b_kids = a.wait_children(2), b.wait_children(2)
    a_holder = a.wait_event("SupervisorStarted", 20)["holder"]
    b_holder = b.wait_event("SupervisorStarted", 20)["holder"]
    assert ns_pid(a.inner()) == ns_pid(b.inner()) == 1
    # Same hostname, same pid: before, both holders were just "hostname:1".
    assert a_holder.rsplit(":", 1)[0] == b_holder.rsplit(":", 1)[0] == f"{socket.gethostname()}:1"
    assert a_holder != b_holder
    a_local = {ns_pid(p): p for p in a_kids}
    b_local = {ns_pid(p): p for p in b_kids}
    same = sorted(set(a_local) & set(b_local))
    assert same, f"no worker pid shared by the namespaces: {a_local} {b_local}"

    insert_jobs(pg, "work", [{"loop": 8}] * 4)
    running = wait_until(
        lambda: (h := holders(pg)) and sorted(map(len, h.values())) == [2, 2] and h,
        15,
        "each supervisor to run two jobs",
    )
    assert set(running) == {a_holder, b_holder}
    b_jobs = running[b_holder]
    b_rows = {j: job(pg, j) for j in b_jobs}

    victim = a_local[same[0]]  # A's worker whose pid equals one of B's workers' pids
    victim_job = wait_until(
        lambda: next((j for j in running[a_holder] if j in title(victim)), None),
        5,
        "the job of A's worker",
    )
    os.kill(victim, signal.SIGKILL)
    failed = wait_until(
        lambda: (r := job(pg, victim_job))["state"] == "failed" and r,
        10,
        "A to record its worker's crash",
    )
    assert failed["attempts"] == 1 and "SIGKILL" in failed["last_error"]

    # B's jobs: still B's, still running, leases extended past the lease (3 s) by B alone.
    time.sleep(4)
    for job_id in b_jobs:
        row = job(pg, job_id)
        assert row["state"] == "processing" and row["locked_by"] == b_holder, row
        assert row["attempts"] == 1 and row["last_error"] is None, row
        assert row["locked_until"] > b_rows[job_id]["locked_until"], row
    wait_until(lambda: all(job(pg, j)["state"] == "done" for j in b_jobs), 15, "B's jobs to finish")
    for job_id in b_jobs:
        row = job(pg, job_id)
        assert row["attempts"] == 1 and row["last_error"] is None, row
    assert sorted(b.children()) == sorted(b_kids)  # none of B's workers was touched
    assert b.events("WorkerExited") == [] and b.events("LeaseLost") == []
    assert b.events("JobFailed") == [] and b.events("JobReleased") == []
    assert [e["reason"] for e in a.events("WorkerExited")] == ["crash"]
    assert a.stop() == 0 and b.stop() == 0
