"""Partitions (issue 23): a big history behind the live rows, retention by partition drop, and
the drain while a snapshot is held open.

1. **History.** Claim latency (``claim_topic``, one row, autocommit, ``claims`` times over
   ``claim_ready`` ready rows: p50/p99) and the drain of ``drain_jobs`` no-op jobs by ``brooq
   supervise --workers 8``, on a fresh table, then on one holding ``history_rows`` terminal
   rows (10 M) over 10 daily partitions of the past: the ratios history / empty.
2. **Retention.** ``retention_rows`` terminal rows in one old daily partition (and ready
   rows a claimer takes at ~200/s): retention by partition drop (``drop_partitions``, what
   ``Retention`` does first) against today's batched delete (``delete_terminal``, batch
   1,000, to the end): rows/s, WAL bytes written, claim p99 while it runs (for the drop,
   the second from its start).
3. **Snapshot held.** A supervisor (8 workers) drains batches of ``snapshot_batch`` jobs
   one after the other for ``snapshot_s`` seconds (5 minutes), once while another session
   holds a REPEATABLE READ snapshot open the whole time (its xmin keeps every dead row and
   index entry), once without: jobs/s over the window and over its last fifth.

QUICK runs a tiny variant only when asked (``--quick --only partitions``): 10 M rows and
10 minutes of draining are no smoke test.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from benchmarks.harness import (
    QUICK,
    TOPIC,
    Context,
    SupervisorProcess,
    load_ready_jobs,
    percentile,
)
from benchmarks.retention import CLAIM_RATE, claimer
from benchmarks.snapshot import hold

GROUP = "partitions (issue 23: history, retention by drop, a snapshot held)"
HISTORY_TOPIC = "bench.history"
DAY = timedelta(days=1)


@dataclass(frozen=True)
class PartitionSizes:
    """How much work each part does."""

    history_rows: int = 10_000_000
    history_days: int = 10
    claim_ready: int = 50_000
    claims: int = 2_000
    drain_jobs: int = 20_000
    workers: int = 8
    retention_rows: int = 1_000_000
    snapshot_s: float = 300.0
    snapshot_batch: int = 2_000


FULL_SIZES = PartitionSizes()
QUICK_SIZES = PartitionSizes(
    history_rows=20_000,
    claim_ready=2_000,
    claims=200,
    drain_jobs=400,
    workers=2,
    retention_rows=5_000,
    snapshot_s=3.0,
    snapshot_batch=200,
)


def bound(at: datetime) -> str:
    """The smallest UUIDv7 of ``at``'s millisecond, as a quoted literal (a partition bound)."""
    h = f"{int(at.timestamp() * 1000) << 80:032x}"
    return f"'{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}'"


def past_days(conn: psycopg.Connection[Any], days: int) -> datetime:
    """Rebuild the (empty) table's layout with a partition a day over the past ``days`` days
    and 3 ahead, as brooq's maintenance would have made them; the first day's start."""
    names = [
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'job'::regclass AND c.relname <> 'job_default'"
        )
    ]
    for name in names:
        conn.execute(f'DROP TABLE "{name}"')
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    start = today - days * DAY
    conn.execute(
        f"CREATE TABLE job_initial PARTITION OF job FOR VALUES FROM (MINVALUE) TO ({bound(start)})"
    )
    options = "WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100)"
    for n in range(days + 3):
        lo = start + n * DAY
        conn.execute(
            f'CREATE TABLE "job_p{lo:%Y%m%d}_000000" PARTITION OF job '
            f"FOR VALUES FROM ({bound(lo)}) TO ({bound(lo + DAY)}) {options}"
        )
    return start


HISTORY = (
    "INSERT INTO job (id, topic, payload, state, attempts, created_at, updated_at) "
    "SELECT encode(substring(int8send((extract(epoch FROM t) * 1000)::bigint) FROM 3) "
    "              || substring(uuid_send(gen_random_uuid()) FROM 7), 'hex')::uuid, "
    "       %(topic)s, jsonb_build_object('i', i), 'done', 1, t, t "
    "FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i, "
    "     LATERAL (SELECT %(start)s::timestamptz + make_interval(secs => i * %(step)s)) AS at(t)"
)


def load_history(conn: psycopg.Connection[Any], rows: int, start: datetime, days: float) -> None:
    """``rows`` done rows spread evenly over ``days`` from ``start``, a million a statement."""
    step = days * 86400 / rows
    for first in range(1, rows + 1, 1_000_000):
        last = min(rows, first + 999_999)
        conn.execute(
            HISTORY,
            {"topic": HISTORY_TOPIC, "first": first, "last": last, "start": start, "step": step},
        )
    conn.execute("VACUUM ANALYZE job")


def claim_latency(dsn: str, ready: int, claims: int) -> tuple[float, float]:
    """p50 and p99 (ms) of ``claims`` one-row claims with ``ready`` ready rows."""
    from brooq.postgres.sql import sql

    params = {
        "holder": "bench:claim",
        "lease": timedelta(minutes=5),
        "topic": TOPIC,
        "limit": 1,
        "app_version": None,
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        load_ready_jobs(conn, ready, notify=False)
        conn.execute("ANALYZE job")
        statement = sql("claim_topic")
        for _ in range(20):  # warm: connection, prepared plan
            conn.execute(statement, params)
        times = []
        for _ in range(claims):
            t0 = time.perf_counter()
            conn.execute(statement, params).fetchall()
            times.append((time.perf_counter() - t0) * 1000)
        conn.execute("DELETE FROM job WHERE topic = %s", (TOPIC,))
    return percentile(times, 50), percentile(times, 99)


def done_since(conn: psycopg.Connection[Any], since: datetime) -> int:
    """Jobs of the drain's topic settled done since ``since`` (job_terminal_idx by time)."""
    row = conn.execute(
        "SELECT count(*) FROM job WHERE state IN ('done', 'dead', 'canceled') "
        "AND updated_at >= %s AND state = 'done' AND topic = %s",
        (since, TOPIC),
    ).fetchone()
    assert row is not None
    return int(row[0])


def drain_batch(conn: psycopg.Connection[Any], sup: SupervisorProcess, jobs: int) -> float:
    """Load ``jobs`` ready jobs and wait until they are done; seconds."""
    since = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    load_ready_jobs(conn, jobs)
    started = time.perf_counter()
    last, last_change = -1, started
    while (done := done_since(conn, since)) < jobs:
        now = time.perf_counter()
        if done != last:
            last, last_change = done, now
        elif now - last_change > 60:
            raise RuntimeError(f"stalled at {done} of {jobs} done:\n{sup.log_tail()}")
        if not sup.alive():
            raise RuntimeError(f"the supervisor exited:\n{sup.log_tail()}")
        time.sleep(0.05)
    return time.perf_counter() - started


def supervisor(ctx: Context, dsn: str, workers: int) -> SupervisorProcess:
    """A ready ``brooq supervise`` of the no-op app."""
    sup = SupervisorProcess(dsn, "benchmarks.apps:queue", workers, "100ms", ctx.workdir).start()
    sup.wait_ready()
    return sup


def history_part(ctx: Context, sizes: PartitionSizes, history: bool) -> dict[str, float]:
    """Claim p50/p99 and the drain's jobs/s, on an empty table or behind the history."""
    with ctx.server.fresh("parthist" if history else "partempty") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            start = past_days(conn, sizes.history_days)
            if history:
                load_history(conn, sizes.history_rows, start, sizes.history_days - 0.5)
        p50, p99 = claim_latency(dsn, sizes.claim_ready, sizes.claims)
        sup = supervisor(ctx, dsn, sizes.workers)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                seconds = drain_batch(conn, sup, sizes.drain_jobs)
        finally:
            sup.stop()
    return {"p50": p50, "p99": p99, "drain": sizes.drain_jobs / seconds}


def wal_lsn(conn: psycopg.Connection[Any]) -> int:
    """The WAL insert position, in bytes."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def retention_part(ctx: Context, sizes: PartitionSizes, drop: bool) -> dict[str, float]:
    """Old terminal rows gone by partition drop, or by today's batched delete."""
    from brooq.postgres.store import PostgresStore

    with ctx.server.fresh("partdrop" if drop else "partdelete") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            start = past_days(conn, 10)
            load_history(conn, sizes.retention_rows, start + DAY, 0.9)  # one old partition
            load_ready_jobs(conn, 50_000 if sizes is FULL_SIZES else 2_000, notify=False)
            conn.execute("ANALYZE job")
        spawn = mp.get_context("spawn")
        ready, stop, out = spawn.Event(), spawn.Event(), spawn.Queue()
        proc = spawn.Process(target=claimer, args=(dsn, CLAIM_RATE, ready, stop, out), daemon=True)
        proc.start()
        store = PostgresStore(dsn)
        try:
            if not ready.wait(60):
                raise RuntimeError("the claimer did not start")
            time.sleep(1.0)
            with psycopg.connect(dsn, autocommit=True) as conn:
                wal0 = wal_lsn(conn)
                began = time.monotonic()
                if drop:
                    gone = sum(d.rows for d in store.drop_partitions(timedelta(days=3), 20))
                else:
                    gone = 0
                    while n := sum(c for _, c in store.delete_terminal(timedelta(days=3), 1000)):
                        gone += n
                ended = time.monotonic()
                wal = wal_lsn(conn) - wal0
                left = conn.execute(
                    "SELECT count(*) FROM job WHERE topic = %s", (HISTORY_TOPIC,)
                ).fetchone()
            time.sleep(max(0.0, began + 1.0 - time.monotonic()))
            stop.set()
            samples: list[tuple[float, float, bool]] = out.get(timeout=60)
            proc.join(30)
        finally:
            store.close()
            stop.set()
            if proc.is_alive():
                proc.kill()
    if left != (0,):
        raise RuntimeError(f"{left} history rows left after retention")
    window = max(ended, began + 1.0)
    during = [ms for t, ms, _ in samples if began <= t < window]
    return {
        "rows_per_s": sizes.retention_rows / max(ended - began, 1e-6),
        "wal": float(wal),
        "p99": percentile(during, 99) if during else 0.0,
        "estimated": float(gone),
    }


def snapshot_part(ctx: Context, sizes: PartitionSizes, held: bool) -> dict[str, float]:
    """Batches drained back to back for ``snapshot_s``, with or without a snapshot held."""
    with ctx.server.fresh("partxmin" if held else "partfree") as dsn:
        holder = psycopg.connect(dsn)
        try:
            if held:
                hold(holder, "rr")  # the snapshot is taken at its SELECT count(*) FROM job
            sup = supervisor(ctx, dsn, sizes.workers)
            marks: list[tuple[float, int]] = []
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    began, jobs = time.perf_counter(), 0
                    while time.perf_counter() - began < sizes.snapshot_s:
                        drain_batch(conn, sup, sizes.snapshot_batch)
                        jobs += sizes.snapshot_batch
                        marks.append((time.perf_counter() - began, jobs))
            finally:
                sup.stop()
        finally:
            holder.close()
    total_s, total = marks[-1]
    tail = [(t, n) for t, n in marks if t >= 0.8 * total_s] or marks[-1:]
    before = max([(t, n) for t, n in marks if t < tail[0][0]] or [(0.0, 0)])
    tail_rate = (total - before[1]) / max(total_s - before[0], 1e-6)
    return {"rate": total / total_s, "tail": tail_rate}


def run_round(ctx: Context, round_no: int) -> None:
    """One round of the three parts (QUICK: the tiny variant, only when asked for by name)."""
    quick = ctx.sizes == QUICK
    sizes = QUICK_SIZES if quick else FULL_SIZES
    logging.getLogger("brooq.retention").setLevel(logging.ERROR)

    def add(key: str, value: float, label: str, unit: str, higher: bool = True) -> None:
        ctx.results.add(
            f"partitions.{key}",
            value,
            round_no=round_no,
            group=GROUP,
            label=label,
            unit=unit,
            higher_is_better=higher,
        )

    def history() -> None:
        empty = history_part(ctx, sizes, history=False)
        full = history_part(ctx, sizes, history=True)
        rows = f"{sizes.history_rows:,} terminal rows behind"
        for name, got in (("empty", empty), ("history", full)):
            where = rows if name == "history" else "an empty table"
            add(f"claim_p50.{name}", got["p50"], f"claim p50, {where}", "ms", False)
            add(f"claim_p99.{name}", got["p99"], f"claim p99, {where}", "ms", False)
            add(
                f"drain.{name}",
                got["drain"],
                f"drain, {sizes.workers} workers, {sizes.drain_jobs:,} jobs, {where}",
                "jobs/s",
            )
        for pct in ("p50", "p99"):
            add(
                f"claim_{pct}.ratio",
                full[pct] / empty[pct],
                f"claim {pct}: history / empty",
                "x",
                False,
            )
        add("drain.ratio", full["drain"] / empty["drain"], "drain: history / empty", "x")

    def retention() -> None:
        for name, drop in (("drop", True), ("delete", False)):
            got = retention_part(ctx, sizes, drop)
            how = "partition drop" if drop else "batched delete (1,000 a batch)"
            rows = f"{sizes.retention_rows:,} rows"
            add(f"retention.{name}.rows_per_s", got["rows_per_s"], f"{how}, {rows}", "rows/s")
            add(f"retention.{name}.wal", got["wal"], f"{how}: WAL written", "bytes", False)
            add(
                f"retention.{name}.claim_p99",
                got["p99"],
                f"{how}: claim p99 meanwhile",
                "ms",
                False,
            )

    def snapshot() -> None:
        free = snapshot_part(ctx, sizes, held=False)
        held = snapshot_part(ctx, sizes, held=True)
        span = f"{sizes.snapshot_s:g}s of {sizes.snapshot_batch:,}-job batches"
        for name, got in (("free", free), ("held", held)):
            words = "a snapshot held open" if name == "held" else "no snapshot held"
            add(f"snapshot.{name}", got["rate"], f"drain, {span}, {words}", "jobs/s")
            add(f"snapshot.{name}.tail", got["tail"], f"drain, last fifth, {words}", "jobs/s")
        add("snapshot.ratio", held["rate"] / free["rate"], "drain: snapshot held / none", "x")

    ctx.guarded(f"round {round_no + 1} partitions history", history)
    ctx.guarded(f"round {round_no + 1} partitions retention", retention)
    ctx.guarded(f"round {round_no + 1} partitions snapshot", snapshot)
