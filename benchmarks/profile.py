"""Where the time goes: py-spy on the supervisor and one child during the largest drain.

``--profile DIR`` records both with ``py-spy record --format raw --idle
--nonblocking`` (wall-clock samples, idle ones included, the target never
paused) from the moment the jobs are committed until they are all done, and
the child a second time without ``--idle`` (only the samples py-spy sees as
active: on a CPU, or runnable and waiting for one). Every sample is sorted
into one category by the frames on its stack. The raw stacks stay in DIR
(flamegraph.pl can draw them).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import Context

RATE_HZ = 200
ROLES = {
    "parent": "supervisor, every sample (wall clock)",
    "child": "one worker, every sample (wall clock)",
    "child-active": "the same worker, samples py-spy saw not idle (on a CPU or runnable)",
}

# (category, test on the frames of one sample, leaf first); the first that matches wins.
CATEGORIES: list[tuple[str, Any]] = [
    (
        "idle: waiting for work (LISTEN / select)",
        lambda fr: any("wait_for_jobs" in f or f.startswith("Supervisor.wait ") for f in fr),
    ),
    (
        "psycopg Connection.wait: blocked on the socket until PostgreSQL answers",
        lambda fr: "psycopg" in fr[0] and fr[0].split(" ")[0].split(".")[-1].startswith("wait"),
    ),
    (
        "libpq send of the statement (it wakes the backend, which often takes the CPU here)",
        lambda fr: "psycopg" in fr[0] and "_send_query" in fr[0],
    ),
    ("logging (JSON log lines)", lambda fr: any("logging/" in f for f in fr)),
    ("prometheus_client metrics", lambda fr: any("prometheus_client" in f for f in fr)),
    ("process title (setproctitle)", lambda fr: any("osproc.py" in f for f in fr)),
    ("pipe to/from the parent", lambda fr: any("protocol.py" in f for f in fr)),
    ("psycopg client code (Python side)", lambda fr: any("psycopg" in f for f in fr)),
    ("the handler", lambda fr: any("benchmarks/apps.py" in f for f in fr)),
    ("brooq code (runner, store, supervisor)", lambda fr: any("brooq/" in f for f in fr)),
]
OTHER = "other Python"


def classify(stack: str) -> str:
    """The category of one collapsed stack (``root;…;leaf``)."""
    frames = stack.split(";")[::-1]
    for name, test in CATEGORIES:
        if test(frames):
            return name
    return OTHER


def summarize(path: Path) -> Counter[str]:
    """Samples per category in a py-spy raw (collapsed) file."""
    counts: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[classify(stack)] += int(n)
    return counts


def _py_spy() -> str | None:
    found = shutil.which("py-spy")
    local = Path(sys.executable).parent / "py-spy"
    return found or (str(local) if local.exists() else None)


@dataclass
class Spy:
    """The running py-spy processes of one drain."""

    name: str
    directory: Path
    workers: int
    started: float
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def stop(self, ctx: Context, jobs: int) -> None:
        """SIGINT py-spy (it writes its file), then summarize into the run's notes."""
        seconds = time.perf_counter() - self.started
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        report: dict[str, Any] = {
            "drain_seconds": round(seconds, 3),
            "jobs": jobs,
            "workers": self.workers,
            "rate_hz": RATE_HZ,
        }
        lines = [
            f"profile of the {self.workers}-worker drain ({jobs:,} jobs in {seconds:.1f}s; "
            f"py-spy at {RATE_HZ} Hz, ms per job from sample counts):"
        ]
        for role in self.procs:
            path = self.directory / f"{self.name}-{role}.txt"
            if not path.exists():
                lines.append(f"  {role}: no profile written (see {path.with_suffix('.log')})")
                continue
            counts = summarize(path)
            total = sum(counts.values()) or 1
            # A child ran about jobs / workers of the jobs; the parent saw all of them.
            jobs_seen = jobs / self.workers if role.startswith("child") else jobs
            ms_per_sample = 1000 / RATE_HZ / jobs_seen
            shares = {k: round(100 * v / total, 1) for k, v in counts.most_common()}
            report[role] = {
                "samples": total,
                "share_pct": shares,
                "ms_per_job": round(total * ms_per_sample, 4),
            }
            lines.append(
                f"  {role}: {ROLES[role]} ({total} samples, "
                f"{total * ms_per_sample:.3f} ms per job):"
            )
            for k, n in counts.most_common():
                lines.append(f"    {100 * n / total:5.1f}%  {n * ms_per_sample:7.3f} ms  {k}")
        ctx.results.notes["profile"] = report
        ctx.results.notes["profile summary"] = "\n".join(lines)


def start(ctx: Context, name: str, parent: int, children: list[int]) -> Spy | None:
    """Start py-spy on ``parent`` and the first child; None (noted) when py-spy is missing."""
    exe = _py_spy()
    assert ctx.profile_dir is not None
    if exe is None:
        ctx.results.notes["profile summary"] = "py-spy not found: pip install py-spy"
        return None
    ctx.profile_dir.mkdir(parents=True, exist_ok=True)
    spy = Spy(name, ctx.profile_dir, len(children), time.perf_counter())
    for role, pid in (("parent", parent), ("child", children[0]), ("child-active", children[0])):
        out = ctx.profile_dir / f"{name}-{role}.txt"
        idle = [] if role == "child-active" else ["--idle"]
        with open(out.with_suffix(".log"), "wb") as log:
            spy.procs[role] = subprocess.Popen(
                [
                    exe,
                    "record",
                    "--pid",
                    str(pid),
                    "--format",
                    "raw",
                    *idle,
                    "--nonblocking",
                    "--rate",
                    str(RATE_HZ),
                    "-o",
                    str(out),
                ],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
    return spy
