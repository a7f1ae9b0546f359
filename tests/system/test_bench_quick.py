"""The benchmark harness runs end to end (``python -m benchmarks --quick --rounds 1``).

Tiny sizes, one round, results written into a temporary directory so the
tree stays clean. Nothing here asserts anything about speed: only that every
benchmark ran, produced its figures, and the run exited 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 85

pytestmark = [pytest.mark.system, pytest.mark.db, pytest.mark.timeout(RUN_TIMEOUT_S + 30)]

EXPECTED_FIGURES = [
    "enqueue.brooq",
    "enqueue.brooq_nonotify",
    "enqueue.raw",
    "bulk.brooq",
    "bulk.raw_unnest",
    "bulk.raw_executemany",
    "bulk.raw_copy",
    "drain.brooq.N2",
    "drain.raw_two.P2",
    "drain.raw_fused.P2",
    "drain.raw_batch.P2",
    "priority.mixed.N2",
    "cpu.brooq.parent_cpu",
    "cpu.brooq.workers_cpu",
    "latency.notify_on.p50",
    "latency.notify_off.p99",
    "claim.rows5000.p99",
    "claim.rows1000.p99",
    "retention.rows_per_s",
    "retention.claim_p99_during",
]


def test_quick_benchmark_runs_and_writes_its_results(server_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "LOG_"))}
    env["BENCH_DATABASE_URL"] = server_url
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--rounds",
            "1",
            "--results-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    written = list(tmp_path.glob("*.json"))
    assert len(written) == 1, written
    doc = json.loads(written[0].read_text())
    assert doc["quick"] is True and doc["rounds"] == 1
    assert doc["errors"] == []
    missing = [k for k in EXPECTED_FIGURES if k not in doc["figures"]]
    assert not missing, f"figures not produced: {missing}"
    assert all(f["values"] for f in doc["figures"].values())
    assert doc["machine"]["cores"] and doc["postgres"]["fsync"]
    assert "results:" in done.stdout
