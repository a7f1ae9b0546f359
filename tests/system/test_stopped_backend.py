"""The supervisor loop is never stalled by its own database work: the PostgreSQL backends of a
running supervisor are frozen with SIGSTOP for longer than the lease (a backend stuck on I/O, a
frozen VM of a proxy: the connection is open and silent). The loop keeps turning (/healthz
answers, SIGTERM acts), running jobs keep their lease or are interrupted, nothing runs twice.

The backends are found by the client ports of the supervisor's own sockets, so the test's
connection and the workers' are never stopped. Runs as root (os.kill of the ``postgres`` OS
user's processes), as CI does; every stopped backend is continued whatever happens.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import Supervisor, count, insert_jobs, job, wait_until
from tests.system.obs_helpers import healthz, http_addr

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = "sysapp_promises:queue"


def args(lease_s: float) -> tuple[str, ...]:
    return (
        "--workers",
        "2",
        "--lease",
        f"{lease_s:g}s",
        "--poll-interval",
        "200ms",
        "--graceful-timeout",
        "3s",
    )


def socket_inodes(pid: int) -> set[str]:
    """The inodes of every socket ``pid`` (all its threads) has open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    return inodes


def local_ports(inodes: set[str]) -> list[int]:
    """The local TCP ports of the sockets with these inodes (/proc/net/tcp and tcp6)."""
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def parent_backends(pg: psycopg.Connection[Any], supervisor_pid: int) -> list[int]:
    """The backend pids serving the supervisor process itself (not its workers)."""
    ports = local_ports(socket_inodes(supervisor_pid))
    return sorted(
        r[0]
        for r in pg.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND client_port = ANY(%s) AND pid <> pg_backend_pid()",
            (ports,),
        )
    )


@contextlib.contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    """SIGSTOP ``pids``; SIGCONT them on the way out, whatever happened."""
    stopped = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        yield
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def runs(trace: Path) -> dict[str, list[tuple[float, float | None]]]:
    """Each job's runs as (start, end) times from the handler's trace; end None if it never
    returned."""
    found: dict[str, list[tuple[float, float | None]]] = {}
    for line in trace.read_text().splitlines():
        entry = json.loads(line)
        spans = found.setdefault(entry["job_id"], [])
        if entry.get("end"):
            start, _ = spans[-1]
            spans[-1] = (start, entry["at"])
        else:
            spans.append((entry["at"], None))
    return found


def turning(addr: str, seconds: float) -> list[float]:
    """Ask /healthz every 0.5 s for ``seconds``; how long each answer took (any status)."""
    took = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        asked = time.monotonic()
        status, reason = healthz(addr)
        assert status in (200, 503), f"/healthz did not answer: {reason}"
        took.append(time.monotonic() - asked)
        time.sleep(0.5)
    return took


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("lease_s", "kept"), [(3.0, False), (12.0, True)], ids=["lease-3s", "lease-12s"]
)
def test_frozen_backends_of_the_supervisor_stall_nothing(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path, lease_s: float, kept: bool
) -> None:
    """Frozen for longer than the lease. With a 12 s lease the parent cuts the stuck
    connections and heartbeats get through on new ones: every lease is kept. With 3 s the cut
    (after 2 s) comes too late: the running jobs are interrupted before their lease ends, and
    run again later, never charged for it."""
    assert os.geteuid() == 0, "SIGSTOP of PostgreSQL's backends needs root (as in CI)"
    pg.execute("CREATE TABLE handled (job_id uuid NOT NULL UNIQUE)")
    trace = tmp_path / "trace"
    sup: Supervisor = supervise(*args(lease_s), app=APP)
    addr = http_addr(sup)
    sup.wait_children(2)
    holder = sup.wait_event("SupervisorStarted", 5)["holder"]
    long_jobs = insert_jobs(
        pg, "work", [{"loop": 2 * lease_s + 6, "record": True, "trace": str(trace)}] * 2
    )
    wait_until(
        lambda: count(pg, "state = 'processing' AND locked_by = %s", [holder]) == 2,
        15,
        "both long jobs to run",
    )
    short_jobs = insert_jobs(pg, "work", [{"loop": 0.2, "record": True, "trace": str(trace)}] * 6)
    backends = parent_backends(pg, sup.pid)
    assert len(backends) >= 2, backends  # at least the claims and the writes lanes
    # Freeze right after a heartbeat landed: the next one is the first to get stuck.
    first = job(pg, long_jobs[0])["locked_until"]
    wait_until(
        lambda: job(pg, long_jobs[0])["locked_until"] > first, lease_s, "a heartbeat", interval=0.02
    )
    before = {j: job(pg, j)["locked_until"] for j in long_jobs}

    with frozen(backends):
        # Longer than the lease: every statement the parent sends on them now waits forever.
        took = turning(addr, lease_s + 1)
        assert max(took) < 2.0, took
        assert sup.events("DatabaseStuck"), "the loop never noticed its stuck database work"
        for job_id in long_jobs:
            row = job(pg, job_id)
            interrupted = sup.events("LeaseLost", job_id=job_id)
            if kept:  # still ours, the lease extended through a new connection
                assert not interrupted, interrupted
                assert row["state"] == "processing" and row["locked_by"] == holder, row
                assert row["locked_until"] > before[job_id], row
            else:
                assert interrupted or row["locked_by"] == holder, row
    wait_until(lambda: count(pg, "state <> 'done'") == 0, 60, "every job done after SIGCONT")

    ids = long_jobs + short_jobs
    handled = [str(r[0]) for r in pg.execute("SELECT job_id FROM handled")]
    assert sorted(handled) == sorted(ids)  # each job's effect committed once
    spans = runs(trace)
    for job_id in ids:
        mine = sorted(spans[job_id], key=lambda s: s[0])
        for (_, end), (start, _) in itertools.pairwise(mine):
            assert end is not None and end <= start, f"{job_id} ran twice at once: {mine}"
        row = job(pg, job_id)
        assert row["last_error"] is None, row
    # The stall charged nobody: one charged attempt each (an interrupted run is not one).
    assert count(pg, "attempts - expirations <> 1") == 0
    if kept:
        assert count(pg, "id = ANY(%s) AND attempts = 1 AND expirations = 0", [long_jobs]) == 2
        assert sup.events("LeaseLost") == [] and sup.events("WorkerKilled") == []

    # SIGTERM acts while the (new) backends are frozen again: a bounded, clean stop.
    with frozen(parent_backends(pg, sup.pid)):
        sup.send(signal.SIGTERM)
        stopping = time.monotonic()
        assert sup.wait_exit(30) == 0
        assert time.monotonic() - stopping < 25


@pytest.mark.timeout(90)
def test_a_claim_cut_as_stuck_takes_no_job_when_its_backend_wakes(
    pg: psycopg.Connection[Any], supervise: Any
) -> None:
    """Idle workers: the producer's claim is what meets the frozen backend. The parent cuts
    it, but the backend still holds the claim it was sent; woken, it used to run it: rows
    claimed for nobody, left ``processing`` until their lease ran out, then counted as a
    host death (``expirations``) that never happened. The parent now ends a backend it cut
    (``pg_terminate_backend``, by pid and client port) from its next connection."""
    assert os.geteuid() == 0, "SIGSTOP of PostgreSQL's backends needs root (as in CI)"
    sup: Supervisor = supervise(*args(3.0), app=APP)
    sup.wait_children(2)
    time.sleep(1.0)  # the producer polls: a claim every 200 ms
    backends = parent_backends(pg, sup.pid)
    with frozen(backends):
        wait_until(
            lambda: [e for e in sup.events("DatabaseStuck") if e["task"].startswith("claim")],
            10,
            "a claim cut as stuck",
        )
        ids = insert_jobs(pg, "work", [{"loop": 0.3}] * 20)
        time.sleep(1.0)  # the claims go on through new connections
    wait_until(lambda: count(pg, "state <> 'done'") == 0, 60, "every job done")
    assert count(pg, "id = ANY(%s) AND attempts = 1 AND expirations = 0", [ids]) == 20
    assert sup.events("JobRequeued") == []
    assert sup.stop() == 0
