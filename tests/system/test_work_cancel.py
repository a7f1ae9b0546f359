"""``brooq work`` learns a cancel by LISTEN (its Keeper thread), not at the next heartbeat."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import PYTHONPATH, count, insert_jobs, job, run_cli, wait_until

pytestmark = [pytest.mark.system, pytest.mark.db]


@pytest.mark.timeout(60)
def test_brooq_work_interrupts_a_canceled_job_at_once(
    pg: psycopg.Connection[Any], tmp_path: Path, dsn: str
) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("QUEUE_", "BROOQ_", "LOG_")) and k != "DATABASE_URL"
    }
    # A 60 s lease: the heartbeat (every 20 s) cannot be what interrupts the handler.
    env.update(
        {
            "DATABASE_URL": dsn,
            "PYTHONPATH": PYTHONPATH,
            "QUEUE_LEASE": "60s",
            "QUEUE_POLL_INTERVAL": "200ms",
            "PYTHONUNBUFFERED": "1",
        }
    )
    log = open(tmp_path / "work.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "brooq.cli", "work", "--app", "sysapp:queue"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        mark = tmp_path / "interrupted"
        (target,) = insert_jobs(pg, "work", [{"loop": 30, "mark": str(mark)}])
        wait_until(
            lambda: count(pg, "id = %s AND state = 'processing'", (target,)) == 1,
            15,
            "brooq work to take the job",
        )
        time.sleep(0.5)  # the handler is in its loop; the Keeper listens
        done = run_cli(dsn, tmp_path, "cancel", target)
        canceled_at = time.time()
        assert done.returncode == 0, done.stderr
        wait_until(
            lambda: mark.exists() and mark.read_text().count(" ") == 1,
            3.0,
            "the handler to be interrupted",
        )
        reason, at = mark.read_text().split()
        assert reason == "JobCanceledWhileRunning"
        assert float(at) - canceled_at < 1.5
        wait_until(lambda: job(pg, target)["state"] == "canceled", 5, "canceled")
        assert job(pg, target)["attempts"] == 1
        assert proc.poll() is None, "brooq work goes on after the cancel"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        log.close()
