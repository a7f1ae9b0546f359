"""What every benchmark shares: sizes, fresh databases, supervisors, /proc, stats and the report.

Each measurement runs in its own database, cloned from a migrated template
(``CREATE DATABASE … TEMPLATE``, like tests/conftest.py) on the server that
``scripts/pg.sh up`` starts, or on ``BENCH_DATABASE_URL``. Figures collect one
value per round; the report gives the median and the min–max of the rounds.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from brooq.osproc import pid_alive

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
DB_PREFIX = "brooqbench"
TOPIC = "bench.noop"
LATENCY_TOPIC = "bench.latency"

# Settings that must not leak from the caller's environment into a supervisor.
_SCRUBBED_PREFIXES = ("QUEUE_", "BROOQ_", "LOG_")
_SCRUBBED = {"DATABASE_URL", "HTTP_ADDR", "CREDENTIALS_DIRECTORY", "PYTHONPATH"}


# --- sizes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How much work each benchmark does; ``QUICK`` only proves the harness runs."""

    enqueue_single: int = 5_000
    enqueue_bulk: int = 50_000
    bulk_batch: int = 1_000
    drain_jobs: int = 20_000
    drain_workers: tuple[int, ...] = (2, 4, 8)
    batch_claim: int = 10
    poll_interval: str = "100ms"
    latency_jobs: int = 200
    latency_rate: float = 20.0
    latency_workers: int = 2
    latency_poll_interval: str = "1s"
    claim_rows: int = 1_000_000
    claim_baseline_rows: int = 10_000
    claims: int = 2_000
    retention_rows: int = 1_000_000
    retention_batch: int = 1_000
    retention_claim_rows: int = 50_000
    retention_baseline_s: float = 3.0
    peer_batch: int = 10
    cpu_jobs: int = 10_000
    cpu_workers: tuple[int, ...] = (2, 8)
    idle_workers: int = 8
    idle_seconds: float = 10.0
    idle_poll_interval: str = "1s"
    extras_calls: int = 20_000
    middleware_calls: int = 20_000

    @property
    def max_workers(self) -> int:
        """The largest worker count: CPU, priorities and peers are measured there."""
        return max(self.drain_workers)


FULL = Sizes()
QUICK = Sizes(
    enqueue_single=200,
    enqueue_bulk=2_000,
    bulk_batch=500,
    drain_jobs=400,
    drain_workers=(2,),
    latency_jobs=20,
    claim_rows=5_000,
    claim_baseline_rows=1_000,
    claims=200,
    retention_rows=5_000,
    retention_claim_rows=2_000,
    retention_baseline_s=0.5,
    cpu_jobs=200,
    cpu_workers=(2,),
    idle_workers=2,
    idle_seconds=1.0,
    extras_calls=2_000,
    middleware_calls=2_000,
)


# --- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile (``pct`` in 0..100) of ``values``."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))  # ceil without floats drifting
    return ordered[min(len(ordered), int(rank)) - 1]


@dataclass
class Figure:
    """One measured quantity: a value per round."""

    key: str
    group: str
    label: str
    unit: str
    higher_is_better: bool
    values: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Median, min, max and the per-round values, for the JSON file."""
        return {
            "group": self.group,
            "label": self.label,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "median": round(statistics.median(self.values), 4) if self.values else None,
            "min": round(min(self.values), 4) if self.values else None,
            "max": round(max(self.values), 4) if self.values else None,
            "values": [round(v, 4) for v in self.values],
            "rounds": self.rounds,
        }


@dataclass(frozen=True)
class Ratio:
    """brooq / reference, from the two figures' values of the same rounds."""

    label: str
    numerator: str
    denominator: str | Callable[[Results], str | None]


class Results:
    """Every figure, note and error of one run."""

    def __init__(self) -> None:
        self.figures: dict[str, Figure] = {}
        self.notes: dict[str, Any] = {}
        self.errors: list[str] = []

    def add(
        self,
        key: str,
        value: float,
        *,
        round_no: int,
        group: str,
        label: str,
        unit: str,
        higher_is_better: bool = True,
    ) -> None:
        """Record ``value`` for ``key`` in round ``round_no``."""
        fig = self.figures.setdefault(key, Figure(key, group, label, unit, higher_is_better))
        fig.values.append(float(value))
        fig.rounds.append(round_no)

    def value(self, key: str, round_no: int) -> float | None:
        """The value ``key`` got in round ``round_no``, if any."""
        fig = self.figures.get(key)
        if fig is None:
            return None
        for r, v in zip(fig.rounds, fig.values, strict=True):
            if r == round_no:
                return v
        return None

    def median(self, key: str) -> float | None:
        """The median of ``key`` over the rounds, if measured."""
        fig = self.figures.get(key)
        return statistics.median(fig.values) if fig and fig.values else None

    def ratio(self, ratio: Ratio) -> dict[str, Any] | None:
        """Per-round ratios of two figures (interleaved rounds pair them); None if unmeasured."""
        den = ratio.denominator(self) if callable(ratio.denominator) else ratio.denominator
        num_fig = self.figures.get(ratio.numerator)
        if den is None or num_fig is None or den not in self.figures:
            return None
        per_round = []
        for r, v in zip(num_fig.rounds, num_fig.values, strict=True):
            d = self.value(den, r)
            if d:
                per_round.append(v / d)
        if not per_round:
            return None
        return {
            "label": ratio.label,
            "numerator": ratio.numerator,
            "denominator": den,
            "median": round(statistics.median(per_round), 4),
            "min": round(min(per_round), 4),
            "max": round(max(per_round), 4),
            "values": [round(x, 4) for x in per_round],
        }

    def count_deadlocks(self, where: str, deadlocks: int) -> None:
        """Note deadlocks (SQLSTATE 40P01) a drain ran into; they are not errors of the run."""
        self.notes.setdefault("deadlocks", {})
        self.notes["deadlocks"][where] = deadlocks
        seen = {k: v for k, v in self.notes["deadlocks"].items() if v}
        self.notes["deadlocks seen"] = (
            "; ".join(f"{k}: {v}" for k, v in seen.items()) if seen else "none"
        )

    def error(self, where: str, exc: BaseException) -> None:
        """Record a benchmark that failed; the run goes on and exits 1 at the end."""
        text = f"{where}: {type(exc).__name__}: {exc}"
        self.errors.append(text)
        print(f"\n!! {text}", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)


# --- the database server ----------------------------------------------------------------------


def with_db(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname``."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def server_url() -> str:
    """BENCH_DATABASE_URL, or the throwaway cluster of scripts/pg.sh (started if needed)."""
    url = os.environ.get("BENCH_DATABASE_URL")
    if url:
        return url
    pg_sh = str(ROOT / "scripts" / "pg.sh")
    done = subprocess.run([pg_sh, "up"], capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/pg.sh up failed:\n{done.stderr}")
    return subprocess.run([pg_sh, "url"], capture_output=True, text=True, check=True).stdout.strip()


class Server:
    """The PostgreSQL server: a migrated template and fresh databases cloned from it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.admin = psycopg.connect(with_db(url, "postgres"), autocommit=True)
        self.template = f"{DB_PREFIX}_{os.getpid()}_tpl"
        self._counter = itertools.count()
        self._template_ready = False
        self._drop_stale()

    def _drop_stale(self) -> None:
        rows = self.admin.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{DB_PREFIX}\\_%",)
        ).fetchall()
        for (name,) in rows:
            pid = name.split("_")[1]
            if pid.isdigit() and not pid_alive(int(pid)):
                self.drop(name)

    def drop(self, name: str) -> None:
        """DROP DATABASE … WITH (FORCE)."""
        self.admin.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
        )

    def ensure_template(self) -> None:
        """Create and migrate the template database once (``brooq migrate up``'s code)."""
        if self._template_ready:
            return
        from brooq.postgres import migrations

        self.drop(self.template)
        self.admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(self.template)))
        migrations.up(with_db(self.url, self.template))
        self._template_ready = True

    @contextlib.contextmanager
    def fresh(self, label: str) -> Iterator[str]:
        """A new migrated database for one measurement; dropped afterwards."""
        self.ensure_template()
        name = f"{DB_PREFIX}_{os.getpid()}_{next(self._counter)}_{label}"[:63]
        self.admin.execute(
            pgsql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                pgsql.Identifier(name), pgsql.Identifier(self.template)
            )
        )
        try:
            yield with_db(self.url, name)
        finally:
            self.drop(name)

    @contextlib.contextmanager
    def empty(self, label: str) -> Iterator[str]:
        """A new database without brooq's schema (for peer queues)."""
        name = f"{DB_PREFIX}_{os.getpid()}_{next(self._counter)}_{label}"[:63]
        self.admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        try:
            yield with_db(self.url, name)
        finally:
            self.drop(name)

    def settings(self) -> dict[str, str]:
        """The server settings that shape the figures."""
        out = {"version": str(self.admin.execute("SELECT version()").fetchone()[0])}  # type: ignore[index]
        for name in (
            "server_version",
            "fsync",
            "synchronous_commit",
            "shared_buffers",
            "wal_level",
            "full_page_writes",
            "max_connections",
            "max_wal_size",
            "checkpoint_timeout",
            "wal_buffers",
            "commit_delay",
        ):
            row = self.admin.execute(pgsql.SQL("SHOW {}").format(pgsql.Identifier(name))).fetchone()
            out[name] = str(row[0]) if row else ""
        return out

    def close(self) -> None:
        """Drop the template and close the admin connection."""
        with contextlib.suppress(psycopg.Error):
            self.drop(self.template)
        self.admin.close()


# --- /proc ------------------------------------------------------------------------------------


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name; None when gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return data[data.rindex(")") + 2 :].split()


def children_of(ppid: int) -> list[int]:
    """Live children of ``ppid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields and int(fields[1]) == ppid and fields[0] not in ("Z", "X"):
                found.append(int(entry))
    return sorted(found)


def backend_pids(conn: psycopg.Connection[Any]) -> list[int]:
    """PostgreSQL backends of this database other than ``conn``'s, if the server is local."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    ).fetchall()
    return [int(pid) for (pid,) in rows if Path(f"/proc/{pid}").exists()]


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM, kernel, Python, load average."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / 1024**2, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def git_revision() -> str:
    """The commit the tree is at, with ``+dirty`` when it has changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty.strip() else "")


# --- timing helpers ---------------------------------------------------------------------------


def count(conn: psycopg.Connection[Any], where: str) -> int:
    """Rows of ``job`` matching ``where``."""
    row = conn.execute(f"SELECT count(*) FROM job WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


def wait_done(
    conn: psycopg.Connection[Any],
    expected: int,
    started: float,
    *,
    alive: Callable[[], bool] = lambda: True,
    stall_s: float = 60.0,
    interval: float = 0.05,
) -> float:
    """Poll ``count(*) … WHERE state = 'done'`` every 50 ms until ``expected``; elapsed seconds.

    Raises when no row completes for ``stall_s`` or ``alive()`` turns false.
    """
    last, last_change = -1, time.perf_counter()
    while True:
        done = count(conn, "state = 'done'")
        now = time.perf_counter()
        if done >= expected:
            return now - started
        if done != last:
            last, last_change = done, now
        elif now - last_change > stall_s:
            raise RuntimeError(f"stalled at {done} of {expected} done for {stall_s:.0f}s")
        if not alive():
            done = count(conn, "state = 'done'")  # they may have finished since the count
            if done >= expected:
                return time.perf_counter() - started
            raise RuntimeError(f"the workers exited at {done} of {expected} done")
        time.sleep(interval)


def load_ready_jobs(
    conn: psycopg.Connection[Any],
    jobs: int,
    *,
    topic: str = TOPIC,
    mixed_priorities: bool = False,
    notify: bool = True,
) -> None:
    """Insert ``jobs`` ready jobs of ``topic`` in one statement (and NOTIFY), in one transaction."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO job (topic, payload, priority) "
            "SELECT %(topic)s, jsonb_build_object('i', i), "
            "       CASE WHEN %(mixed)s THEN i %% 10 ELSE 0 END "
            "FROM generate_series(1, %(n)s) AS i",
            {"topic": topic, "mixed": mixed_priorities, "n": jobs},
        )
        if notify:
            conn.execute("SELECT pg_notify('brooq_job', %s)", (topic,))


# --- supervisors ------------------------------------------------------------------------------


class SupervisorProcess:
    """One real ``brooq supervise`` process in its own session, logging JSON to a file."""

    def __init__(
        self,
        dsn: str,
        app: str,
        workers: int,
        poll_interval: str,
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.dsn, self.app, self.workers = dsn, app, workers
        self.poll_interval, self.workdir = poll_interval, workdir
        self.extra_env = dict(env or {})
        self.log_path = (
            workdir / f"supervise-{app.replace(':', '-')}-{os.getpid()}-{time.monotonic_ns()}.log"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """``brooq supervise`` (as ``python -m brooq.cli`` of this interpreter)."""
        return [
            sys.executable,
            "-m",
            "brooq.cli",
            "supervise",
            "--app",
            self.app,
            "--workers",
            str(self.workers),
            "--http-addr",
            "127.0.0.1:0",
            "--poll-interval",
            self.poll_interval,
        ]

    def start(self) -> SupervisorProcess:
        """Start it; stdout and stderr go to the log file."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)
        }
        env.update(
            {
                "DATABASE_URL": self.dsn,
                "PYTHONPATH": str(ROOT),
                "LOG_FORMAT": "json",
                "LOG_LEVEL": "info",
                "PYTHONUNBUFFERED": "1",
                **self.extra_env,
            }
        )
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        """The supervisor's pid (and process group)."""
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """True while the supervisor runs."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The end of its log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait for the SupervisorReady log event (every child booted)."""
        deadline = time.monotonic() + timeout
        offset = 0
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                chunk = log.read()
            end = chunk.rfind(b"\n") + 1
            for line in chunk[:end].splitlines():
                with contextlib.suppress(ValueError):
                    if json.loads(line).get("event") == "SupervisorReady":
                        return
            offset += end
            if not self.alive():
                raise RuntimeError(f"brooq supervise exited before ready:\n{self.log_tail()}")
            time.sleep(0.05)
        raise RuntimeError(f"brooq supervise not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def log_count(self, needle: bytes) -> int:
        """Lines of its log containing ``needle``."""
        try:
            with open(self.log_path, "rb") as log:
                return sum(1 for line in log if needle in line)
        except OSError:
            return 0

    def children(self) -> list[int]:
        """Its worker processes."""
        return children_of(self.pid)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL of the whole process group after ``timeout``."""
        if self.proc is None:
            return
        seen = self.children()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        for pid in seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Context:
    """What a benchmark gets: the server, the sizes, where to write, where to record."""

    server: Server
    sizes: Sizes
    results: Results
    workdir: Path
    rounds: int
    profile_dir: Path | None = None
    peers: list[str] = field(default_factory=list)
    selected: set[str] = field(default_factory=set)
    cpu_ms: float = 2.0
    """The CPU-bound handler's CPU per job (``--cpu-ms``)."""
    results_dir: Path = RESULTS_DIR
    """Where the results JSON goes (``--results-dir``); figures drawn as PNGs go beside it."""
    snapshot_phases: tuple[float, ...] = ()
    """``--snapshot-phases``: the held-snapshot run's clean, held, recovery [, interval] s."""
    snapshot_cells: tuple[str, ...] = ()
    """``--snapshot-cells``: the held-snapshot cells to run (``rr.max``, …); all when empty."""
    snapshot_workers: int = 0
    """``--snapshot-workers``: the held-snapshot run's workers; its default when 0."""

    def wants(self, name: str) -> bool:
        """True when benchmark ``name`` was selected."""
        return name in self.selected

    def guarded(self, where: str, fn: Callable[[], Any]) -> Any:
        """Run one measurement; a failure is recorded and the run goes on."""
        try:
            return fn()
        except Exception as exc:
            self.results.error(where, exc)
            return None


def new_workdir() -> Path:
    """A directory for supervisor logs (the caller removes it)."""
    return Path(tempfile.mkdtemp(prefix="brooq-bench-"))


def write_results(
    results: Results, meta: dict[str, Any], ratios: list[dict[str, Any]], directory: Path
) -> Path:
    """Write ``<directory>/<UTC timestamp>.json`` atomically; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = directory / f"{stamp}.json"
    doc = {
        **meta,
        "figures": {k: f.summary() for k, f in results.figures.items()},
        "ratios": ratios,
        "notes": results.notes,
        "errors": results.errors,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def fmt(value: float | None) -> str:
    """A number with a sensible number of digits."""
    if value is None:
        return "-"
    if value == int(value) and abs(value) < 1000:
        return str(int(value))  # a count
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def render(
    results: Results, meta: dict[str, Any], ratios: list[dict[str, Any]], group_order: Sequence[str]
) -> str:
    """The report: machine, server, every figure (median, min–max), the ratios, errors."""
    m, pg = meta["machine"], meta["postgres"]
    out = [
        f"brooq benchmarks · {meta['started_at']} · git {meta['git']} · "
        f"{meta['rounds']} round(s){' · QUICK' if meta['quick'] else ''}",
        f"machine: {m['cpu_model']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, "
        f"Linux {m['kernel']}, Python {m['python']}; load average {m['loadavg_start']} at "
        f"start, {m.get('loadavg_end')} at end",
        f"postgres: {pg.get('server_version')}; fsync={pg.get('fsync')} "
        f"synchronous_commit={pg.get('synchronous_commit')} "
        f"shared_buffers={pg.get('shared_buffers')} wal_level={pg.get('wal_level')} "
        f"full_page_writes={pg.get('full_page_writes')}",
        "",
    ]
    width = max([len(f.label) for f in results.figures.values()] + [40])
    head = f"{'figure':<{width}}  {'median':>10}  {'min – max':>21}  unit"
    groups = list(group_order) + sorted(
        {f.group for f in results.figures.values()} - set(group_order)
    )
    out.append(head)
    out.append("-" * len(head))
    for group in groups:
        figs = [f for f in results.figures.values() if f.group == group]
        if not figs:
            continue
        out.append(f"[{group}]")
        for f in figs:
            s = f.summary()
            spread = f"{fmt(s['min'])} – {fmt(s['max'])}"
            out.append(f"  {f.label:<{width - 2}}  {fmt(s['median']):>10}  {spread:>21}  {f.unit}")
    if ratios:
        out += ["", "ratios (per-round ratio of the interleaved pair; median, min–max)"]
        rw = max(len(r["label"]) for r in ratios)
        for r in ratios:
            out.append(
                f"  {r['label']:<{rw}}  {r['median']:>6.2f}   ({r['min']:.2f} – {r['max']:.2f})"
            )
    for key, note in results.notes.items():
        if isinstance(note, str):
            out += ["", f"{key}: {note}"]
    if results.errors:
        out += ["", "ERRORS:"] + [f"  {e}" for e in results.errors]
    return "\n".join(out)


def sizes_dict(sizes: Sizes) -> dict[str, Any]:
    """The sizes as JSON."""
    return asdict(sizes)


def warm(queue: Any) -> None:
    """Open the queue's connection before a clock starts (one trivial query)."""
    from brooq.postgres.inspection import PostgresInspection

    PostgresInspection(queue.store.connector).ping()
