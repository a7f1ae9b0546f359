"""CPU per job, from /proc, around a drain.

For every process of the system measured (brooq: the supervisor, its
workers, the PostgreSQL backends of its database; the raw loops: their
processes and backends; pgqueuer: its processes and backends; Celery: its
main process, its pool processes and the Redis server), the
``/proc/<pid>/task/<tid>/schedstat`` of **every thread** before and after
gives the time spent on a CPU and the time spent runnable but waiting for
one (the run queue: what an oversubscribed machine costs). Threads are
summed per process (``/proc/<pid>/schedstat`` alone is the main thread only,
and brooq's supervisor does its database work in threads); a thread that
ends during the drain loses what it spent (none of the systems measured
starts a thread per job). For the workers, wall time − CPU − run queue =
time blocked, i.e. waiting on PostgreSQL (or their parent).

WAL: the benchmark database gets ``track_wal_io_timing = on`` (when the role
may set it), so ``pg_stat_wal.wal_sync_time`` counts the time its backends
spent in WAL fsyncs at commit; ``wal_sync`` (the number of fsyncs) is
cluster-wide: anything else writing to the same server counts too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from benchmarks.harness import Context, backend_pids

GROUP = "CPU per 1,000 jobs (drain at the largest worker count)"
PER_JOB_GROUP = "CPU per job, all processes of each system (ms on a CPU per job)"
STATS_FLUSH_S = 0.5  # for exited backends' counters to land

Threads = dict[int, tuple[float, float]]
"""(seconds on a CPU, seconds waiting for one) by thread id."""


def threads(pid: int) -> Threads | None:
    """The schedstat of every thread of ``pid``; None when it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out: Threads = {}
    for tid in tids:
        try:
            on_cpu, waiting, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[int(tid)] = (int(on_cpu) / 1e9, int(waiting) / 1e9)
    return out or None


def schedstat(pid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds waiting for one) of ``pid``, all its threads summed."""
    found = threads(pid)
    if found is None:
        return None
    return sum(v[0] for v in found.values()), sum(v[1] for v in found.values())


def spent(before: Threads, after: Threads) -> tuple[float, float]:
    """What a process's threads spent between two samples (a new thread: all of it)."""
    on = wait = 0.0
    for tid, (a_on, a_wait) in after.items():
        b_on, b_wait = before.get(tid, (0.0, 0.0))
        on += a_on - b_on
        wait += a_wait - b_wait
    return on, wait


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

    def total(self) -> float:
        """Seconds on a CPU, every group summed."""
        return sum(self.cpu.values())


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


def _sample(pids: list[int]) -> dict[int, Threads]:
    return {p: s for p in pids if (s := threads(p)) is not None}


class CpuProbe:
    """Snapshot now; :meth:`finish` returns what was spent since.

    ``groups`` names the system's processes (``parent``, ``workers``,
    ``redis``…); with a connection, the other backends of its database
    (less ``exclude``) are the group ``postgres``.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any] | None,
        groups: Mapping[str, Sequence[int]],
        wal: bool = False,
        exclude: Sequence[int] = (),
    ) -> None:
        self.conn, self.wal = conn, wal
        self.pids = {g: list(p) for g, p in groups.items() if p}
        if conn is not None:
            self.pids["postgres"] = [p for p in backend_pids(conn) if p not in exclude]
        self.before = {g: _sample(p) for g, p in self.pids.items()}
        self.wal_before = _wal(conn) if wal and conn is not None else {}
        self.started = time.perf_counter()

    def finish(self) -> CpuUsage:
        """Seconds per group since the snapshot (processes seen at both ends); WAL deltas."""
        usage = CpuUsage(wall=time.perf_counter() - self.started)
        for group, pids in self.pids.items():
            after = _sample(pids)
            both = [p for p in self.before[group] if p in after]
            if both:
                used = [spent(self.before[group][p], after[p]) for p in both]
                usage.cpu[group] = sum(u[0] for u in used)
                usage.runq[group] = sum(u[1] for u in used)
                usage.processes[group] = len(both)
        return usage

    def read_wal(self, usage: CpuUsage) -> None:
        """WAL counters' deltas into ``usage``; call once the measured backends have exited.

        A backend publishes its WAL counters when it has been idle a while or
        when it exits; exiting is the only moment that is sure.
        """
        if self.wal and self.conn is not None:
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
        "parent": "supervisor (parent, all its threads)",
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


PARTS = {
    "parent": "the supervisor (parent, all its threads)",
    "workers": "its workers, summed",
    "postgres": "the PostgreSQL backends of its database",
}


def record_per_job(
    ctx: Context,
    round_no: int,
    key: str,
    label: str,
    usage: CpuUsage,
    jobs: int,
    *,
    handler_ms: float = 0.0,
    parts: bool = False,
) -> None:
    """``cpujob.<key>``: ms on a CPU per job, every process of the system summed.

    With ``parts`` (brooq), also each part (the supervisor next to its
    workers) and the CPU per job outside the handler (total − ``handler_ms``).
    """

    def add(suffix: str, text: str, ms_per_job: float) -> None:
        ctx.results.add(
            f"cpujob.{key}{suffix}",
            ms_per_job,
            round_no=round_no,
            group=PER_JOB_GROUP,
            label=f"{label}: {text}",
            unit="ms/job",
            higher_is_better=False,
        )

    total = usage.total() * 1000 / jobs
    add("", f"all processes ({', '.join(sorted(usage.cpu))})", total)
    if not parts:
        return
    for group in ("parent", "workers", "postgres"):
        if group in usage.cpu:
            add(f".{group}", PARTS[group], usage.cpu[group] * 1000 / jobs)
    add(".outside", f"outside the handler (all − {handler_ms:g} ms)", total - handler_ms)
