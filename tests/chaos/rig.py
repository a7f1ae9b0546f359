"""The chaos rig: run size, supervisors of the ledger app, /healthz polling, results files.

``CHAOS_SIZE``: ``quick`` (default, the CI size: 2,000 jobs per fault), ``full``
(20,000), or a number of jobs. ``CHAOS_RESULTS``: the directory the measured
numbers go to (default ``$TMPDIR/brooq-chaos/<size>``); ``python -m
tests.chaos.report`` turns them into the table of docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.checker import Executes, Plan, Verdict, check, unfinished, write_results
from tests.system.harness import Supervisor, alive, children_of, title, wait_until

APPS = Path(__file__).resolve().parent / "apps"
SIZES = {"quick": 2000, "full": 20000}
SIZE = os.environ.get("CHAOS_SIZE", "quick") or "quick"
JOBS = SIZES[SIZE] if SIZE in SIZES else int(SIZE)
WORKERS = 4
LEASE_S = 3.0
REAPER_S = 5.0  # max(5s, lease/4)
RESULTS = Path(
    os.environ.get("CHAOS_RESULTS") or Path(tempfile.gettempdir()) / "brooq-chaos" / SIZE
)
DRAIN_TIMEOUT_S = 90 + JOBS / 40
TEST_TIMEOUT_S = int(DRAIN_TIMEOUT_S * 2 + 120)
SUPERVISOR_ARGS = (
    "--workers",
    str(WORKERS),
    "--http-addr",
    "127.0.0.1:0",
    "--lease",
    f"{LEASE_S:g}s",
    "--poll-interval",
    "200ms",
    "--watchdog-grace",
    "1s",
    "--graceful-timeout",
    "5s",
)


def wait_drained(conn: Executes, timeout: float = DRAIN_TIMEOUT_S) -> None:
    """Wait until no job is pending, processing or failed."""
    wait_until(
        lambda: unfinished(conn) == 0, timeout, "every job to reach a terminal state", interval=0.2
    )


def progress(conn: Executes) -> float:
    """The share of jobs that are terminal."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE state IN ('done', 'dead', 'canceled')), count(*) FROM job"
    ).fetchone()
    assert row is not None
    return float(row[0]) / max(1, int(row[1]))


def wait_progress(conn: Executes, share: float, timeout: float = 120) -> None:
    """Wait until at least ``share`` of the jobs are terminal."""
    wait_until(
        lambda: progress(conn) >= share, timeout, f"{share:.0%} of the jobs done", interval=0.05
    )


def worker_pids(sup: Supervisor) -> list[int]:
    """The supervisor's live children that are brooq workers."""
    pids = [p for p in children_of(sup.pid) if title(p).startswith("brooq worker")]
    sup.seen.update(pids)
    return pids


def http_port(sup: Supervisor, timeout: float = 15) -> int:
    """The port of /healthz, from the SupervisorStarted event (``http=127.0.0.1:PORT``)."""
    started = sup.wait_event("SupervisorStarted", timeout)
    return int(str(started["http"]).rsplit(":", 1)[1])


def healthz(port: int) -> int:
    """The status code of GET /healthz (0 when the supervisor does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, urllib.error.URLError):
        return 0


class HealthPoller:
    """Polls /healthz in a thread every ``interval`` s; remembers (monotonic time, status)."""

    def __init__(self, port: int, interval: float = 0.05) -> None:
        self.port, self.interval = port, interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), healthz(self.port)))
            self._stop.wait(self.interval)

    def between(self, start: float, end: float) -> list[int]:
        """Statuses seen in [start, end]."""
        return [s for t, s in list(self.samples) if start <= t <= end]

    def wait_status(self, status: int, timeout: float, what: str) -> float:
        """Wait until a sample after now has ``status``; when it was seen."""
        since = time.monotonic()

        def seen() -> float:
            return next((t for t, s in list(self.samples) if t >= since and s == status), 0.0)

        return wait_until(seen, timeout, what)


def crash_exits(sup: Supervisor) -> int:
    """WorkerExited events with reason crash (a child died without being told to)."""
    return len(sup.events("WorkerExited", reason="crash"))


@dataclass
class Run:
    """One chaos test: its supervisors, side log, faults injected and result record."""

    name: str
    fault: str
    dsn: str
    workdir: Path
    supervisors: list[Supervisor] = field(default_factory=list)
    faults: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @property
    def side_dir(self) -> Path:
        """Where the handlers' side log goes."""
        path = self.workdir / "side"
        path.mkdir(exist_ok=True)
        return path

    def supervise(
        self,
        name: str = "supervisor",
        dsn: str | None = None,
        args: tuple[str, ...] = SUPERVISOR_ARGS,
    ) -> Supervisor:
        """Start ``brooq supervise --app ledger:queue`` (stopped by :meth:`stop_all`)."""
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {"PYTHONPATH": str(APPS), "LEDGER_DIR": str(self.side_dir), "TMPDIR": str(tmp)}
        sup = Supervisor(
            dsn or self.dsn, self.workdir, app="ledger:queue", args=args, env=env, name=name
        )
        self.supervisors.append(sup)
        return sup.start()

    def kill_supervisor(self, sup: Supervisor) -> list[int]:
        """SIGKILL a supervisor; wait ≤ 2 s for all its workers to die with it. Their pids."""
        kids = worker_pids(sup)
        os.kill(sup.pid, signal.SIGKILL)
        wait_until(
            lambda: not any(alive(p) for p in kids),
            2.0,
            f"the children {kids} of the killed supervisor to die",
        )
        sup.wait_exit(5)
        return kids

    def stop_all(self) -> None:
        """Stop every supervisor (SIGTERM, then SIGKILL of all leftovers)."""
        for sup in self.supervisors:
            with contextlib.suppress(Exception):
                sup.stop(timeout=15)

    def finish(
        self,
        conn: Executes,
        plan: Plan,
        *,
        strict: bool = False,
        lease_faults: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> Verdict:
        """Check every job; write the results file; the verdict (asserted by the caller)."""
        verdict = check(conn, plan, self.side_dir, strict=strict, lease_faults=lease_faults)
        record = {
            "test": self.name,
            "fault": self.fault,
            "size": SIZE,
            "workers": WORKERS,
            "behaviours": {b: plan.count(b) for b in sorted(set(plan.behaviour.values()))},
            "faults": self.faults,
            "runtime_s": round(time.monotonic() - self.started, 1),
            "problems": len(verdict.problems),
            "first_problems": verdict.problems[:10],
            **verdict.numbers(),
            **(extra or {}),
        }
        write_results(RESULTS / f"{self.name}.json", record)
        return verdict


def load_results(directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Every results file in ``directory``."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def mark_result(run: Run, *, passed: bool) -> None:
    """Record in the run's results file whether its test passed (every assertion, not only
    the checker's)."""
    path = RESULTS / f"{run.name}.json"
    if path.exists():
        record = json.loads(path.read_text())
        record["passed"] = passed
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
