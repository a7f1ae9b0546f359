"""Boot cost and memory of a worker, with and without preloading the app (SIGHUP's trade-off).

    python -m benchmarks.preload [--workers 4] [--rounds 3]

Two apps: ``small`` (brooq and one handler: benchmarks.apps) and ``heavy``
(also imports SQLAlchemy's ORM and Django's models, as a real app might).
Three ways to start a worker:

- ``preload``: the parent imported the app; the worker is a bare fork
  (what ``brooq supervise`` does, and what it does again after SIGHUP);
- ``after-fork``: the parent imported brooq only; the worker imports the
  app after fork (gunicorn without ``preload_app``);
- ``exec``: a fresh interpreter imports brooq and the app (a re-exec).

Boot is fork (or spawn) to "ready" on a pipe. Memory per worker is its USS
(private pages) and PSS from /proc/<pid>/smaps_rollup, right after boot and
again after a full ``gc.collect()``, which writes to every tracked object's
header and so unshares the pages a preloading parent shared (the worst case
of copy-on-write under CPython's reference counting). Numbers: median over
rounds of the mean over workers. No database is needed.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = """
import sqlalchemy
import sqlalchemy.orm
import django.db.models
import brooq
from benchmarks.apps import queue
"""
ROOT = Path(__file__).resolve().parents[1]


def smaps(pid: int) -> tuple[int, int]:
    """(USS, PSS) of ``pid`` in bytes."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) * 1024
    return fields["Private_Clean"] + fields["Private_Dirty"], fields["Pss"]


def _child(module: str, import_after_fork: bool, ready: int, go: int) -> None:
    if import_after_fork:
        importlib.import_module(module)
    os.write(ready, b"r")
    os.read(go, 1)  # the parent measures; then a full collection
    gc.collect()
    os.write(ready, b"g")
    os.read(go, 1)
    os._exit(0)


EXEC_CHILD = """
import gc, importlib, os, sys
importlib.import_module(sys.argv[1])
ready, go = int(sys.argv[2]), int(sys.argv[3])
os.write(ready, b"r"); os.read(go, 1); gc.collect(); os.write(ready, b"g"); os.read(go, 1)
"""


def measure(module: str, how: str, workers: int) -> dict[str, float]:
    """Start ``workers`` workers the ``how`` way; boot seconds, USS and PSS MiB."""
    boots, pids, pipes = [], [], []
    for _ in range(workers):
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        started = time.perf_counter()
        if how == "exec":
            proc = subprocess.Popen(
                [sys.executable, "-c", EXEC_CHILD, module, str(ready_w), str(go_r)],
                pass_fds=(ready_w, go_r),
                cwd=ROOT,
            )
            pid = proc.pid
        else:
            pid = os.fork()
            if pid == 0:
                _child(module, how == "after-fork", ready_w, go_r)
        os.read(ready_r, 1)
        boots.append(time.perf_counter() - started)
        pids.append(pid)
        pipes.append((ready_r, go_w))
    booted = [smaps(p) for p in pids]
    for ready_r, go_w in pipes:
        os.write(go_w, b"g")
        os.read(ready_r, 1)
    collected = [smaps(p) for p in pids]
    for (ready_r, go_w), pid in zip(pipes, pids, strict=True):
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(go_w)
    mib = 1024 * 1024
    return {
        "boot_ms": statistics.mean(boots) * 1000,
        "uss_mib": statistics.mean(u for u, _ in booted) / mib,
        "pss_mib": statistics.mean(p for _, p in booted) / mib,
        "uss_after_gc_mib": statistics.mean(u for u, _ in collected) / mib,
        "pss_after_gc_mib": statistics.mean(p for _, p in collected) / mib,
    }


def run_one(app: str, how: str, workers: int) -> dict[str, float]:
    """One measurement in a fresh parent process (so earlier imports do not help)."""
    code = (
        "import json, sys, brooq\n"
        "from benchmarks.preload import measure\n"
        f"if {how == 'preload'!r}: __import__({app!r})\n"
        f"print(json.dumps(measure({app!r}, {how!r}, {workers})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.preload", allow_abbrev=False)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bench_heavy_app.py").write_text(HEAVY)
        os.environ["PYTHONPATH"] = os.pathsep.join([tmp, str(ROOT)])
        os.environ.setdefault("DATABASE_URL", "postgresql://unused@127.0.0.1:1/unused")
        apps = {"small": "benchmarks.apps", "heavy": "bench_heavy_app"}
        print(
            f"{'app':6} {'start':10} {'boot ms':>8} {'USS MiB':>8} {'PSS MiB':>8} "
            f"{'USS gc':>8} {'PSS gc':>8}"
        )
        for name, module in apps.items():
            for how in ("preload", "after-fork", "exec"):
                rounds = [run_one(module, how, args.workers) for _ in range(args.rounds)]
                med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
                print(
                    f"{name:6} {how:10} {med['boot_ms']:8.1f} {med['uss_mib']:8.1f} "
                    f"{med['pss_mib']:8.1f} {med['uss_after_gc_mib']:8.1f} "
                    f"{med['pss_after_gc_mib']:8.1f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
