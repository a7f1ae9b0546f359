"""CPU per job, from /proc, around the drain at the largest worker count.

For the supervisor (parent), its children summed, and the PostgreSQL
backends of the benchmark's database (when the server runs on this machine),
``/proc/<pid>/schedstat`` before and after gives the time each group spent
on a CPU and the time it spent runnable but waiting for one (the run queue:
what an oversubscribed machine costs). For the workers, wall time − CPU −
run queue = time blocked, i.e. waiting on PostgreSQL. The same for the raw
floor's processes.

WAL: the benchmark database gets ``track_wal_io_timing = on`` (when the role
may set it), so ``pg_stat_wal.wal_sync_time`` counts the time its backends
spent in WAL fsyncs at commit; ``wal_sync`` (the number of fsyncs) is
cluster-wide: anything else writing to the same server counts too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from benchmarks.harness import Context, backend_pids

GROUP = "CPU per 1,000 jobs (drain at the largest worker count)"
STATS_FLUSH_S = 0.5  # for exited backends' counters to land


def schedstat(pid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds waiting for one) of ``pid``; None when it is gone."""
    try:
        on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def enable_wal_timing(dsn: str) -> bool:
    """``ALTER DATABASE … SET track_wal_io_timing = on``; False when not allowed."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            name = conn.info.dbname
            conn.execute(
                pgsql.SQL("ALTER DATABASE {} SET track_wal_io_timing = on").format(
                    pgsql.Identifier(name)
                )
            )
        return True
    except psycopg.Error:
        return False


@dataclass
class CpuUsage:
    """Per process group: CPU and run-queue seconds; wall seconds; WAL deltas."""

    cpu: dict[str, float] = field(default_factory=dict)
    runq: dict[str, float] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    wall: float = 0.0
    wal: dict[str, float] = field(default_factory=dict)


def _wal(conn: psycopg.Connection[Any]) -> dict[str, float]:
    try:
        cur = conn.execute(
            "SELECT wal_records, wal_bytes, wal_write, wal_sync, wal_sync_time, "
            "wal_write_time FROM pg_stat_wal"
        )
    except psycopg.Error:
        return {}
    row = cur.fetchone()
    names = [d.name for d in cur.description or []]
    return {n: float(v) for n, v in zip(names, row or (), strict=False)}


def _sample(pids: list[int]) -> dict[int, tuple[float, float]]:
    return {p: s for p in pids if (s := schedstat(p)) is not None}


class CpuProbe:
    """Snapshot now; :meth:`finish` returns what was spent since."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        parent: int | None,
        workers: list[int],
        wal: bool = False,
    ) -> None:
        self.conn, self.wal = conn, wal
        self.pids = {
            "parent": [parent] if parent else [],
            "workers": list(workers),
            "postgres": backend_pids(conn),
        }
        self.before = {g: _sample(p) for g, p in self.pids.items()}
        self.wal_before = _wal(conn) if wal else {}
        self.started = time.perf_counter()

    def finish(self) -> CpuUsage:
        """Seconds per group since the snapshot (processes seen at both ends); WAL deltas."""
        usage = CpuUsage(wall=time.perf_counter() - self.started)
        for group, pids in self.pids.items():
            after = _sample(pids)
            both = [p for p in self.before[group] if p in after]
            if both:
                usage.cpu[group] = sum(after[p][0] - self.before[group][p][0] for p in both)
                usage.runq[group] = sum(after[p][1] - self.before[group][p][1] for p in both)
                usage.processes[group] = len(both)
        return usage

    def read_wal(self, usage: CpuUsage) -> None:
        """WAL counters' deltas into ``usage``; call once the measured backends have exited.

        A backend publishes its WAL counters when it has been idle a while or
        when it exits; exiting is the only moment that is sure.
        """
        if self.wal:
            time.sleep(STATS_FLUSH_S)
            after = _wal(self.conn)
            usage.wal = {k: after[k] - v for k, v in self.wal_before.items() if k in after}


def record(ctx: Context, round_no: int, who: str, label: str, usage: CpuUsage, jobs: int) -> None:
    """Add ms per 1,000 jobs of ``usage`` as figures ``cpu.<who>.<what>``."""
    per_k = 1000.0 / jobs

    def add(what: str, text: str, value: float, unit: str = "ms/1k jobs") -> None:
        ctx.results.add(
            f"cpu.{who}.{what}",
            value,
            round_no=round_no,
            group=GROUP,
            label=f"{label}: {text}",
            unit=unit,
            higher_is_better=False,
        )

    names = {
        "parent": "supervisor (parent)",
        "workers": "workers, summed",
        "postgres": "PostgreSQL backends of its database",
    }
    for group, seconds in usage.cpu.items():
        add(f"{group}_cpu", f"{names[group]}, on CPU", seconds * 1000 * per_k)
    for group in ("workers", "postgres"):
        if group in usage.runq:
            add(
                f"{group}_runq",
                f"{names[group]}, waiting for a CPU",
                usage.runq[group] * 1000 * per_k,
            )
    if "workers" in usage.cpu:
        wall = usage.wall * usage.processes["workers"]
        blocked = wall - usage.cpu["workers"] - usage.runq["workers"]
        add("workers_wall", "workers, summed, wall time", wall * 1000 * per_k)
        add(
            "workers_blocked",
            "workers, summed, blocked (waiting on PostgreSQL)",
            blocked * 1000 * per_k,
        )
    if usage.wal.get("wal_sync_time"):
        add(
            "wal_sync_time",
            "WAL fsync time at commit (this database's backends)",
            usage.wal["wal_sync_time"] * per_k,
        )
    if "wal_sync" in usage.wal:
        add(
            "wal_sync",
            "WAL fsyncs (cluster-wide count)",
            usage.wal["wal_sync"] * per_k,
            unit="per 1k jobs",
        )
