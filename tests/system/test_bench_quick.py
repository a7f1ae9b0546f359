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
    # the CPU-bound workload (--cpu-ms, default 2) for brooq and the raw loops
    "cpubound.ideal",
    "cpubound.brooq.N2",
    "cpubound.raw_two.P2",
    "cpubound.raw_batch.P2",
    # jobs done when each drain's clock started
    "start.drain.brooq.N2",
    "start.drain.raw_two.P2",
    "start.drain.raw_batch.P2",
    "start.priority.mixed.N2",
    "start.cpubound.brooq.N2",
    "start.cpubound.raw_two.P2",
    # CPU per job of every process of the system, no-op and CPU-bound
    "cpujob.noop.brooq.N2",
    "cpujob.noop.brooq.N2.parent",
    "cpujob.noop.brooq.N2.workers",
    "cpujob.noop.raw_two.P2",
    "cpujob.noop.raw_batch.P2",
    "cpujob.cpu.brooq.N2",
    "cpujob.cpu.brooq.N2.outside",
    "cpujob.cpu.brooq.N2.parent",
    "cpujob.cpu.raw_two.P2",
    "cpujob.cpu.raw_batch.P2",
    # an idle supervisor; what each per-job extra costs in a worker
    "idle.parent_pct",
    "idle.workers_pct",
    "idle.supervisor_pct",
    "extras.logs_on.us",
    "extras.logs_default.us",
    "extras.metrics.us",
    "extras.title.us",
    # middleware: none registered, one pass-through, tracing (the dev install has the SDK)
    "middleware.none.us",
    "middleware.one.us",
    "middleware.tracing.us",
    # a stored result against none
    "results.none.N2",
    "results.dict.N2",
    "results.none.wal_bytes_per_job",
    "results.dict.wal_bytes_per_job",
    # a held snapshot (issue 31): clean → held → recovery, per pressure at max drain and half load
    *[
        f"snapshot.{pressure}.{key}"
        for pressure in ("rr", "idle_xid")
        for key in (
            "max.clean_rate",
            "max.held_ratio",
            "max.held_last_ratio",
            "max.recovery_s",
            "max.dead_tuples_peak",
            "max.depth_peak",
            "half.load_rate",
            "half.held_ratio",
            "half.recovery_s",
            "half.dead_tuples_peak",
            "half.pickup_p50_held_ms",
            "half.pickup_p99_held_ms",
            "half.pickup_p99_clean_ms",
        )
    ],
]
TARGETS_MEASURED_WITHOUT_PEERS = [
    "no-op drain, 2 workers: brooq / raw two-commit loop at 2 processes",
    "2 ms CPU-bound drain, 2 workers: brooq / ideal",
    "2 ms CPU-bound drain, 2 workers: brooq's CPU per job outside the handler",
    "idle latency p99 (NOTIFY on)",
    "bulk enqueue: brooq / fastest raw bulk insert",
    "idle supervisor, 2 workers (parent + workers)",
    "per-job log lines (default), metrics, title / a worker's CPU per job (no-op)",
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
    started = {k: f["values"] for k, f in doc["figures"].items() if k.startswith("start.")}
    assert all(v == [0] for v in started.values()), started
    drains = [
        k
        for k in doc["figures"]
        if k.startswith(("drain.", "cpubound.", "priority.", "results."))
        and not k.endswith("wal_bytes_per_job")
    ]
    assert {f"start.{k}" for k in drains if k != "cpubound.ideal"} == set(started)
    assert doc["cpu_ms"] == 2.0
    measured = {t["label"]: t for t in doc["targets"] if t["met"] is not None}
    missing = [label for label in TARGETS_MEASURED_WITHOUT_PEERS if label not in measured]
    assert not missing, f"targets not measured: {missing}"
    assert "Issue 21 targets" in done.stdout
    assert "results:" in done.stdout
