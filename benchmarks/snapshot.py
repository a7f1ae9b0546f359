"""Held snapshot (issue 31): how brooq's drain and pickup latency behave while another
session pins the xmin horizon, and how fast they come back once it lets go.

For each pressure (``rr``: a REPEATABLE READ transaction that has read ``job``; ``idle_xid``:
a transaction that took an XID and went idle) and each load (``max``: a backlog kept topped
up, so the rate is the drain's speed; ``half``: a producer enqueueing at half the clean rate
that the ``max`` run of the same pressure just measured), on a fresh database, a real
``brooq supervise --workers 4`` runs three phases back to back: ``clean`` (nothing held),
``held`` (the pressure open on a second connection) and ``recovery`` (released). Every
interval (10 s at full size) the run samples the ready depth, the dead tuples of the
``job%`` tables (``pg_stat_user_tables``, which backends publish at most once a second) and
one probe of the claim's index scan (the claim's SELECT without its locks, under
``EXPLAIN (ANALYZE, BUFFERS)``: its time and the pages it touched). The handler
(``benchmarks.snapshot:queue``: a no-op that appends its wall-clock start and the job's
enqueue batch to a file of its worker) gives the rate per interval and, against the batch's
commit time, the pickup latency. Figures ``snapshot.<pressure>.<load>.*``; the series go to
the results' notes and to one PNG per pressure and load (benchmarks/snapshot_plot.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg

import brooq
from benchmarks.harness import QUICK, Context, SupervisorProcess
from benchmarks.snapshot_series import PHASES, Run, Sample

GROUP = "held snapshot (issue 31: clean → a snapshot or an XID held → recovery)"
APP = "benchmarks.snapshot:queue"
TOPIC = "bench.snapshot"
PRESSURES: dict[str, tuple[str, ...]] = {
    # On a connection that is not in autocommit: psycopg's own BEGIN opens the transaction.
    "rr": ("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", "SELECT count(*) FROM job"),
    "idle_xid": ("SELECT txid_current()",),
}
LOADS = ("max", "half")
CELLS = tuple(f"{pressure}.{load}" for pressure in PRESSURES for load in LOADS)
"""What ``--snapshot-cells`` names: a pressure and a load."""
RECORD = "{:17.6f} {:9d}\n"
"""A handler's line: its start (wall clock) and the job's enqueue batch. Fixed width, so
that the bytes of a worker's file count the jobs it started without reading it."""
RECORD_BYTES = len(RECORD.format(0.0, 0))
STARTS_DIR_ENV = "BENCH_SNAPSHOT_DIR"

queue = brooq.Queue(os.environ.get("DATABASE_URL", ""))
_files: dict[int, int] = {}


@queue.kind(TOPIC)
def record_start(claim: brooq.Claim) -> None:
    """Append when it started and its batch to this worker's file; otherwise nothing."""
    started = time.time()
    pid = os.getpid()  # a file per worker: no interleaving, and a fork gets its own
    fd = _files.get(pid)
    if fd is None:
        path = Path(os.environ[STARTS_DIR_ENV]) / f"starts-{pid}.txt"
        fd = _files[pid] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    # Unbuffered: a worker may leave by os._exit, and the producer counts the bytes live.
    os.write(fd, RECORD.format(started, claim.payload["b"]).encode())


@dataclass(frozen=True)
class SnapshotSizes:
    """Phase lengths (whole intervals) and the load's shape."""

    clean_s: float = 60.0
    held_s: float = 300.0
    recovery_s: float = 120.0
    interval_s: float = 10.0
    workers: int = 4
    backlog: int = 20_000
    """``max``: ready jobs kept between half of this and all of it."""
    topup_s: float = 0.2
    """``max``: how often the producer looks at the backlog (from the workers' files)."""
    tick_s: float = 0.02
    """``half``: the producer enqueues what is due every tick, in one transaction."""


FULL_SIZES = SnapshotSizes()
QUICK_SIZES = SnapshotSizes(
    clean_s=0.2, held_s=0.4, recovery_s=0.2, interval_s=0.1, backlog=1_000, topup_s=0.05
)


def sizes_for(ctx: Context) -> SnapshotSizes:
    """QUICK or FULL, with ``--snapshot-phases CLEAN,HELD,RECOVERY[,INTERVAL]`` and
    ``--snapshot-workers`` applied."""
    sizes = QUICK_SIZES if ctx.sizes == QUICK else FULL_SIZES
    given = dict(zip(("clean", "held", "recovery", "interval"), ctx.snapshot_phases, strict=False))
    return replace(
        sizes,
        clean_s=given.get("clean", sizes.clean_s),
        held_s=given.get("held", sizes.held_s),
        recovery_s=given.get("recovery", sizes.recovery_s),
        interval_s=given.get("interval", sizes.interval_s),
        workers=ctx.snapshot_workers or sizes.workers,
    )


def hold(conn: psycopg.Connection[Any], pressure: str) -> None:
    """Open ``pressure`` on ``conn`` (not in autocommit) and leave its transaction open: a
    REPEATABLE READ snapshot (``rr``) or an XID (``idle_xid``) that pins the xmin horizon
    until ``conn.rollback()`` or ``conn.close()``."""
    if conn.autocommit:
        raise ValueError("hold() needs a connection that is not in autocommit")
    for statement in PRESSURES[pressure]:
        conn.execute(statement)


def started_jobs(starts: Path) -> int:
    """How many jobs the workers have started so far (their files' bytes, never read)."""
    return sum(p.stat().st_size for p in starts.glob("starts-*.txt")) // RECORD_BYTES


class Producer(threading.Thread):
    """Enqueues batches of ready jobs (one INSERT and NOTIFY, one transaction each): at
    ``rate`` jobs/s, or, without a rate, back up to ``backlog`` whenever fewer than half of
    it wait (counted as enqueued − started, from the workers' files, so that no query
    walks the index while it is bloated). Records each batch's commit time (wall clock)."""

    def __init__(self, dsn: str, starts: Path, sizes: SnapshotSizes, rate: float | None) -> None:
        super().__init__(daemon=True)
        self.dsn, self.starts, self.sizes, self.rate = dsn, starts, sizes, rate
        self.committed: list[float] = []
        self.sent = 0
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        """Loop until ``halt``; an error is kept for ``check``."""
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                began = time.monotonic()
                while not self.halt.is_set():
                    if self.rate is None:
                        waiting = self.sent - started_jobs(self.starts)
                        n = self.sizes.backlog - waiting if waiting < self.sizes.backlog // 2 else 0
                        pause = self.sizes.topup_s
                    else:
                        n = int(self.rate * (time.monotonic() - began)) - self.sent
                        pause = self.sizes.tick_s
                    if n > 0:
                        self.enqueue(conn, n)
                    self.halt.wait(pause)
        except BaseException as exc:
            self.error = exc

    def enqueue(self, conn: psycopg.Connection[Any], n: int) -> None:
        """``n`` jobs of batch ``len(committed)``; its commit time appended once acknowledged."""
        with conn.transaction():
            conn.execute(
                "INSERT INTO job (topic, payload) SELECT %s, jsonb_build_object('b', %s::int) "
                "FROM generate_series(1, %s)",
                (TOPIC, len(self.committed), n),
            )
            conn.execute("SELECT pg_notify('brooq_job', %s)", (TOPIC,))
        self.committed.append(time.time())
        self.sent += n

    def check(self) -> None:
        """Raise the error that stopped the producer, if any."""
        if self.error is not None:
            raise RuntimeError(f"the producer failed: {self.error!r}") from self.error

    def stop(self) -> None:
        """Stop and wait for it."""
        self.halt.set()
        if self.is_alive():
            self.join(30)


PROBE = (
    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM job "
    "WHERE state IN ('pending', 'failed') AND available_at <= now() AND topic = 'bench.snapshot' "
    "ORDER BY priority DESC, available_at, id LIMIT 10"
)
"""The claim's index scan (claim_topic's inner SELECT, without FOR NO KEY UPDATE SKIP LOCKED)."""


def sample(conn: psycopg.Connection[Any]) -> Sample:
    """Ready depth, dead tuples of the ``job%`` tables (stats lag up to ~1 s: backends
    publish when idle, at most once a second), autovacuum runs, the claim probe."""
    depth = conn.execute("SELECT count(*) FROM job WHERE state IN ('pending', 'failed')")
    ready = int(depth.fetchone()[0])  # type: ignore[index]
    conn.execute("SELECT pg_stat_clear_snapshot()")  # no cached stats, whatever the setting
    rows = conn.execute(
        "SELECT relname, n_dead_tup, autovacuum_count FROM pg_stat_user_tables "
        "WHERE relname LIKE 'job%'"
    ).fetchall()
    plan = conn.execute(PROBE).fetchone()[0][0]  # type: ignore[index]
    root = plan["Plan"]
    return Sample(
        depth=ready,
        dead=sum(int(r[1]) for r in rows),
        dead_by_table={str(r[0]): int(r[1]) for r in rows if r[1]},
        autovacuums=sum(int(r[2]) for r in rows),
        probe_ms=float(plan["Execution Time"]),
        probe_pages=int(root.get("Shared Hit Blocks", 0)) + int(root.get("Shared Read Blocks", 0)),
    )


def read_starts(starts: Path) -> list[tuple[float, int]]:
    """Every (start, batch) the workers wrote, by start time."""
    out: list[tuple[float, int]] = []
    for path in starts.glob("starts-*.txt"):
        for line in path.read_text().splitlines():
            at, batch = line.split()
            out.append((float(at), int(batch)))
    out.sort()
    return out


def run_one(
    ctx: Context, sizes: SnapshotSizes, pressure: str, load: str, rate: float | None
) -> Run:
    """The three phases of one pressure and load on a fresh database; what was seen."""
    steps = [max(1, round(s / sizes.interval_s)) for s in (sizes.clean_s, sizes.held_s)]
    steps.append(max(1, round(sizes.recovery_s / sizes.interval_s)))
    phase_of = [p for p, n in zip(PHASES, steps, strict=True) for _ in range(n)]
    tag = f"{pressure}.{load}"
    with ctx.server.fresh(f"snap_{pressure}_{load}") as dsn:
        starts = ctx.workdir / f"snapshot-{pressure}-{load}-{time.monotonic_ns()}"
        starts.mkdir()
        sup = SupervisorProcess(
            dsn, APP, sizes.workers, "100ms", ctx.workdir, env={STARTS_DIR_ENV: str(starts)}
        ).start()
        producer = Producer(dsn, starts, sizes, rate)
        holder = psycopg.connect(dsn)
        samples: list[Sample] = []
        marks = {"clean": 0.0}
        try:
            sup.wait_ready()
            with psycopg.connect(dsn, autocommit=True) as conn:
                producer.start()
                t0_mono, t0 = time.monotonic(), time.time()
                for k, phase in enumerate(phase_of):
                    time.sleep(max(0.0, t0_mono + (k + 1) * sizes.interval_s - time.monotonic()))
                    producer.check()
                    if not sup.alive():
                        raise RuntimeError(f"the supervisor exited:\n{sup.log_tail()}")
                    # The sample closes interval k in its own phase (the last held one still
                    # held); the switch follows, its moment marked, so the phases' windows
                    # start where the pressure really opened or closed.
                    samples.append(replace(sample(conn), at=time.time() - t0, phase=phase))
                    after = phase_of[k + 1] if k + 1 < len(phase_of) else phase
                    if after != phase:
                        if after == "held":
                            hold(holder, pressure)
                        else:
                            holder.rollback()
                        marks[after] = time.time() - t0
                    if ctx.sizes != QUICK:
                        progress(tag, samples[-1], started_jobs(starts))
            producer.stop()
            producer.check()
        finally:
            producer.stop()
            holder.close()
            sup.stop()
        run = Run(
            pressure=pressure,
            load=load,
            interval_s=sizes.interval_s,
            samples=samples,
            marks=marks,
            load_rate=rate,
        )
        run.fill(read_starts(starts), producer.committed, t0)
    return run


def progress(tag: str, s: Sample, started: int) -> None:
    """One line per interval on stderr (full size only)."""
    print(
        f"    snapshot {tag} {s.phase:>8} t={s.at:6.0f}s  depth {s.depth:>7,}  "
        f"dead {s.dead:>9,}  probe {s.probe_ms:7.2f} ms / {s.probe_pages:,} pages  "
        f"started {started:,}",
        file=sys.stderr,
        flush=True,
    )


def record(ctx: Context, round_no: int, run: Run) -> None:
    """The run's figures (``snapshot.<pressure>.<load>.*``) and its series in the notes."""
    tag = f"{run.pressure}.{run.load}"
    words = {"rr": "a REPEATABLE READ snapshot", "idle_xid": "an idle transaction's XID"}
    who = f"{words[run.pressure]}, {'max drain' if run.load == 'max' else 'half load'}"
    for key, (value, unit, higher, label) in run.figures().items():
        ctx.results.add(
            f"snapshot.{tag}.{key}",
            value,
            round_no=round_no,
            group=GROUP,
            label=f"{who}: {label}",
            unit=unit,
            higher_is_better=higher,
        )
    notes = ctx.results.notes.setdefault("snapshot", {})
    notes[f"round{round_no + 1}.{tag}"] = run.as_json()


def run_round(ctx: Context, round_no: int) -> None:
    """Both pressures, each at max then at half of its clean max; in the first round only
    (about 33 minutes at full size: one run is the measurement, `--rounds` repeats the rest)."""
    if round_no > 0:
        return
    sizes = sizes_for(ctx)
    cells = set(ctx.snapshot_cells or CELLS)
    pressures = [p for p in PRESSURES if cells & {f"{p}.{load}" for load in LOADS}]
    drawn: list[Run] = []
    for pressure in pressures:

        def both(pressure: str = pressure) -> None:
            # The half cell offers half of the max cell's clean rate: max always runs first.
            at_max = run_one(ctx, sizes, pressure, "max", None)
            record(ctx, round_no, at_max)
            drawn.append(at_max)
            if f"{pressure}.half" not in cells:
                return
            half = run_one(ctx, sizes, pressure, "half", at_max.clean_rate() / 2)
            record(ctx, round_no, half)
            drawn.append(half)

        ctx.guarded(f"round {round_no + 1} snapshot.{pressure}", both)
    ctx.guarded(f"round {round_no + 1} snapshot figures", lambda: draw(ctx, round_no, drawn))


def draw(ctx: Context, round_no: int, runs: list[Run]) -> None:
    """One PNG per pressure and load next to the results JSON; their names in the notes."""
    from benchmarks import snapshot_plot

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    names = []
    for run in runs:
        path = ctx.results_dir / f"snapshot-{stamp}-r{round_no + 1}-{run.pressure}-{run.load}.png"
        snapshot_plot.draw(run, path)
        names.append(path.name)
    ctx.results.notes.setdefault("snapshot", {})[f"round{round_no + 1}.png"] = names
    print(f"    snapshot figures: {', '.join(names)}", file=sys.stderr, flush=True)
