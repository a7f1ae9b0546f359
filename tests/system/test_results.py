"""Stored results with real processes: ``brooq supervise`` runs the handlers, a caller in
another process waits for each result with a timeout; a job that fails, one canceled while
the caller waits, and one whose result is too large end the wait with the right error.

App: apps/sysapp_results.py. Every wait is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest

from tests.system.harness import PYTHONPATH, insert_jobs, job, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = "sysapp_results:queue"
CALLER = """
import json, sys, time
import brooq
queue = brooq.Queue(sys.argv[1])
out = {}
for job_id in sys.argv[3:]:
    started = time.monotonic()
    try:
        out[job_id] = ["ok", queue.result(job_id, timeout=float(sys.argv[2]))]
    except brooq.JobFailed as exc:
        out[job_id] = [type(exc).__name__, exc.last_error]
    except brooq.ResultTimeout as exc:
        out[job_id] = ["ResultTimeout", str(exc.state)]
    out[job_id].append(round(time.monotonic() - started, 3))
print(json.dumps(out))
"""


def caller(dsn: str, timeout: float, *ids: str) -> subprocess.Popen[str]:
    """A process that waits for each job's result in turn and prints what it got (JSON)."""
    return subprocess.Popen(
        [sys.executable, "-c", CALLER, dsn, str(timeout), *ids],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"},
    )


def answers(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    found: dict[str, Any] = json.loads(out)
    return found


@pytest.mark.timeout(120)
def test_a_caller_in_another_process_gets_results_and_failures(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--workers", "2", "--poll-interval", "200ms", app=APP)
    sup.wait_event("SupervisorReady", 30)
    (done,) = insert_jobs(pg, "sum", [{"numbers": [1, 2, 3], "sleep": 0.5}])
    (failed,) = insert_jobs(pg, "boom", [{}])
    (big,) = insert_jobs(pg, "sum", [{"big": True}])
    (slow,) = insert_jobs(pg, "sum", [{"sleep": 30}])
    waiting = caller(dsn, 20, done, failed, big)
    got = answers(waiting)
    assert got[done][:2] == ["ok", {"sum": 6}]
    assert got[done][2] < 5  # woken by the flush's NOTIFY, not at the timeout
    assert got[failed][0] == "JobDead" and "boom" in got[failed][1]
    assert got[big][0] == "JobDead" and got[big][1].startswith("ResultTooLarge: ")
    # Canceled while a caller waits: its wait ends with JobCanceled, at once.
    wait_until(lambda: job(pg, slow)["state"] == "processing", 10, "the slow job to run")
    waiting = caller(dsn, 30, slow)
    time.sleep(1.0)
    pg.execute("SELECT 1")
    subprocess.run(
        [sys.executable, "-m", "brooq.cli", "cancel", slow, "--reason", "no longer needed"],
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin", "DATABASE_URL": dsn},
        check=True,
        capture_output=True,
        timeout=30,
    )
    got = answers(waiting)
    assert got[slow][0] == "JobCanceled" and "no longer needed" in got[slow][1]
    assert got[slow][2] < 5
    # A short timeout on a job that has not ended.
    (later,) = insert_jobs(pg, "sum", [{"sleep": 5}])
    got = answers(caller(dsn, 0.5, later))
    assert got[later][:2] == ["ResultTimeout", "processing"] or got[later][:2] == [
        "ResultTimeout",
        "pending",
    ]
    row = pg.execute("SELECT result FROM job WHERE id = %s", (done,)).fetchone()
    assert row == ({"sum": 6},)
    assert sup.stop() == 0
