"""The workflows benchmark runs in its tiny variant (``--quick --only workflows``): it is off
in a plain ``--quick`` run (too heavy for that smoke test), so it is proven here.

Nothing about speed is asserted: only that each drain ran with nothing done before its
clock started, and that every figure of the module was produced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.system, pytest.mark.db, pytest.mark.timeout(150)]

FIGURES = [
    "workflows.fanin.N2",
    "workflows.fanin.enqueue_s",
    "workflows.fanin.start_ms.p50",
    "workflows.chains.N2",
    "workflows.chains.enqueue_s",
    "workflows.chains.start_ms.p50",
    "workflows.chains.start_ms.p99",
    "workflows.plain.N2",
    "start.workflows.fanin.N2",
    "start.workflows.chains.N2",
    "start.workflows.plain.N2",
]


def test_the_quick_workflows_benchmark_runs(server_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "LOG_"))}
    env["BENCH_DATABASE_URL"] = server_url
    args = ["--quick", "--only", "workflows", "--rounds", "1", "--results-dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    (written,) = tmp_path.glob("*.json")
    doc = json.loads(written.read_text())
    assert doc["errors"] == [] and doc["selected"] == ["workflows"]
    missing = [k for k in FIGURES if k not in doc["figures"]]
    assert not missing, f"figures not produced: {missing}"
    assert all(doc["figures"][k]["values"] == [0] for k in FIGURES if k.startswith("start."))
    assert "two-job chains / plain jobs" in done.stdout


def test_a_plain_quick_run_leaves_the_workflows_benchmark_out() -> None:
    from benchmarks.__main__ import parse_args

    assert "workflows" not in parse_args(["--quick"]).selected
    assert "workflows" in parse_args([]).selected
    assert parse_args(["--quick", "--only", "workflows"]).selected == {"workflows"}
