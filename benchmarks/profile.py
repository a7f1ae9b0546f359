"""Where the time goes: py-spy on the supervisor and one worker during the largest drain.

``--profile DIR`` records both with ``py-spy record --format raw
--nonblocking`` (the target never paused) from the moment the jobs are
committed until they are all done: once with ``--idle`` (every sample, wall
clock: what a process waits for) and once without (only the samples py-spy
sees as active: on a CPU, or runnable and waiting for one: **where its CPU
goes**). py-spy samples every thread of the supervisor (its loop, the two
database lanes, the LISTEN thread, the HTTP surface).

Every sample is sorted into one category by the frames on its stack:

- a worker: waiting for its next job, the handler, its log lines,
  prometheus_client, the process title, its board, its socket frames to and
  from the parent, the descriptor checks around the handler, brooq's
  executor, the rest of its loop;
- the supervisor: its loop's ``select``; the step of ``Supervisor.tick`` the
  sample is in (``Supervisor.read_workers``, ``Supervisor.dispatch``,
  ``Lanes.collect``…); the database lanes (statements built and results read,
  or waiting on PostgreSQL); the LISTEN thread; the HTTP surface. Its active
  samples are also sorted by library (logging, prometheus_client, psycopg,
  the socket frames, the rest of brooq).

ms per job = samples / rate / jobs that process saw (a worker: jobs / N).
The raw stacks stay in DIR (flamegraph.pl can draw them).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import Context

RATE_HZ = 200
ROLES = {
    "parent": ("supervisor, every sample of every thread (wall clock)", True),
    "parent-active": ("supervisor, samples on a CPU or runnable: its CPU", False),
    "child": ("one worker, every sample (wall clock)", True),
    "child-active": ("the same worker, samples on a CPU or runnable: its CPU", False),
}
Frames = list[str]
"""One sample's frames, leaf first (``function (file:line)``)."""


def _has(frames: Frames, *needles: str) -> bool:
    return any(n in f for f in frames for n in needles)


def _name(frame: str) -> str:
    return frame.split(" (", 1)[0]


# (category, test); the first that matches wins. The worker's frames start at worker_main:
# above it are the parent's, from the tick that forked it.
WORKER: list[tuple[str, Callable[[Frames], bool]]] = [
    ("waiting for its next job (select on its socket)", lambda f: _has(f, "wait_for_jobs")),
    ("the handler", lambda f: _has(f, "benchmarks/apps.py")),
    ("log lines (logging)", lambda f: _has(f, "logging/", "brooq/logs.py")),
    ("prometheus_client (duration histogram)", lambda f: _has(f, "prometheus_client")),
    ("process title (setproctitle)", lambda f: _has(f, "title (brooq/osproc.py", "setproctitle")),
    ("its board (shared memory, semaphore)", lambda f: _has(f, "supervisor/board.py")),
    ("socket frames to and from the parent", lambda f: _has(f, "supervisor/protocol.py")),
    ("descriptor checks around the handler", lambda f: _has(f, "check_fds", "owned_fds")),
    ("brooq's executor (decode, call, decide)", lambda f: _has(f, "brooq/engine/")),
    ("psycopg (a settle with effects)", lambda f: _has(f, "psycopg")),
    ("the rest of the worker's loop", lambda f: _has(f, "brooq/")),
]
LIBRARY: list[tuple[str, Callable[[Frames], bool]]] = [
    ("logging", lambda f: _has(f, "logging/", "brooq/logs.py")),
    ("prometheus_client", lambda f: _has(f, "prometheus_client")),
    ("psycopg", lambda f: _has(f, "psycopg")),
    ("socket frames (protocol)", lambda f: _has(f, "supervisor/protocol.py")),
    ("select / sleep in the loop", lambda f: _has(f, "Supervisor.wait ")),
    ("the rest of brooq", lambda f: _has(f, "brooq/")),
]
OTHER = "other Python"


def _first(rules: list[tuple[str, Callable[[Frames], bool]]], frames: Frames) -> str:
    for name, test in rules:
        if test(frames):
            return name
    return OTHER


def worker_category(frames: Frames) -> str:
    """Where a worker's sample is (its own frames only)."""
    mine = next((i for i, f in enumerate(frames) if f.startswith("worker_main ")), len(frames))
    return _first(WORKER, frames[:mine])


def parent_category(frames: Frames) -> str:
    """Where a supervisor's sample is: a thread, or the step of its loop."""
    if _has(frames, "DatabaseThread._serve"):
        waiting = frames and "psycopg" in frames[0] and _name(frames[0]).endswith("wait")
        return f"database lanes (threads): {'waiting on PostgreSQL' if waiting else 'working'}"
    if _has(frames, "Notices._serve"):
        return "LISTEN thread"
    if _has(frames, "brooq/surface/"):
        return "HTTP surface (threads)"
    if _has(frames, "Supervisor.wait "):
        return "loop: select / sleep (Supervisor.wait)"
    for i, f in enumerate(frames):
        if f.startswith("Supervisor.tick ") and i > 0:
            return f"loop: {_name(frames[i - 1])}"
    return OTHER


def summarize(path: Path, classify: Callable[[Frames], str]) -> Counter[str]:
    """Samples per category in a py-spy raw (collapsed) file."""
    counts: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[classify(stack.split(";")[::-1])] += int(n)
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

    def _section(
        self, role: str, counts: Counter[str], jobs_seen: float, report: dict[str, Any]
    ) -> list[str]:
        total = sum(counts.values()) or 1
        ms_per_sample = 1000 / RATE_HZ / jobs_seen
        report[role] = {
            "samples": total,
            "share_pct": {k: round(100 * v / total, 1) for k, v in counts.most_common()},
            "ms_per_job": round(total * ms_per_sample, 4),
        }
        lines = [
            f"  {role}: {ROLES[role.split(' ')[0]][0]} "
            f"({total} samples, {total * ms_per_sample:.3f} ms per job):"
        ]
        for k, n in counts.most_common():
            lines.append(f"    {100 * n / total:5.1f}%  {n * ms_per_sample:7.3f} ms  {k}")
        return lines

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
            child = role.startswith("child")
            jobs_seen = jobs / self.workers if child else jobs
            classify = worker_category if child else parent_category
            lines += self._section(role, summarize(path, classify), jobs_seen, report)
            if role == "parent-active":
                by_library = summarize(path, lambda f: _first(LIBRARY, f))
                lines += self._section(f"{role} by library", by_library, jobs_seen, report)
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
    targets = {"parent": parent, "parent-active": parent}
    targets |= {"child": children[0], "child-active": children[0]}
    for role, pid in targets.items():
        out = ctx.profile_dir / f"{name}-{role}.txt"
        options = ["--nonblocking", "--rate", str(RATE_HZ), "-o", str(out)]
        idle = ["--idle"] if ROLES[role][1] else []
        with open(out.with_suffix(".log"), "wb") as log:
            spy.procs[role] = subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--format", "raw", *idle, *options],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
    return spy
