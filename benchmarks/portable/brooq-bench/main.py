"""brooq's adapter for the harness's long-horizon contract (../contract.py says what it is).

One process per replica:

- at start, ``brooq migrate up`` (brooq's own install path), then the descriptor,
  naming brooq's tables as found in the database (``job``, its partitions, and
  the tables beside it), so the harness watches whatever storage brooq has;
- ``brooq supervise --app bench_app:queue --workers WORKER_COUNT``, brooq's
  production worker, as a child process that dies with this one (a parent-death
  signal: a SIGKILL of the replica by a chaos phase kills the supervisor too, and
  the supervisor's workers die with it);
- a producer thread: ``Queue.enqueue_many`` (one round trip per batch), paced by
  the harness's ``ENQUEUE <n>`` tokens on stdin, or by its own clock
  (PRODUCER_PACING=adapter), or to a target depth (PRODUCER_MODE=depth-target);
- a receiver thread: the handlers' reports (bench_app.py) over a unix datagram
  socket: pickup latency (insert → handler start) and completions;
- on replica 0, a depth poller: ready and running jobs of the topic, by the
  documented SQL on ``job`` (docs/operations.md, "Looking at the queue");
- the main thread: one sample of every metric on each clock-aligned tick.

SIGTERM (or stdin closed by the harness): stop producing, stop the supervisor
(``--graceful-timeout 2s``), print a tally of the topic's rows by state to
stderr, exit 0 within the contract's 5 s. The supervisor exiting by itself is
a failure: exit 1, which the harness reports as a crashed replica.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.resources
import logging
import os
import queue as queue_mod
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import psycopg  # noqa: E402
from contract import (  # noqa: E402
    OBSERVER_METRICS,
    PICKUP_WINDOW_S,
    Credit,
    Emitter,
    LatencyWindow,
    Report,
    Settings,
    next_tick,
    parse_token,
    payload,
)

import brooq  # noqa: E402

SYSTEM = "brooq"
TOPIC = "bench.job"
GRACEFUL_S = 2
log = logging.getLogger("brooq-bench")

TABLES_SQL = """
SELECT c.oid::regclass::text AS name, c.relkind::text AS kind
FROM pg_class c
WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'job'::regclass)
  AND c.relkind IN ('r', 'p')
  AND c.relname NOT LIKE '%yoyo%'
ORDER BY c.relname <> 'job', c.relname
"""
INDEXES_SQL = """
SELECT i.indexrelid::regclass::text
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_am am ON am.oid = c.relam AND am.amname = 'btree'
WHERE i.indrelid = ANY(%s::regclass[])
ORDER BY 1
"""
READY_SQL = """
SELECT
  (SELECT count(*) FROM job
   WHERE topic = %(topic)s AND state IN ('pending', 'failed') AND available_at <= now()),
  (SELECT count(*) FROM job WHERE topic = %(topic)s AND state = 'processing')
"""
TALLY_SQL = """
SELECT state, count(*), count(*) FILTER (WHERE attempts > 1 OR expirations > 0)
FROM job WHERE topic = %s GROUP BY state ORDER BY state
"""


def qualified(name: str) -> str:
    """``schema.table`` as the harness wants it (regclass text omits ``public.``)."""
    return name if "." in name else f"public.{name}"


class Stats:
    """The counters the threads share; read by the sampler."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.enqueued = 0
        self.completed = 0
        self.enqueue_failures = 0
        self.ready = 0
        self.running = 0
        self.target_rate = 0.0
        self.pickup = LatencyWindow()

    def add_enqueued(self, n: int) -> None:
        """``n`` jobs committed by the producer."""
        with self.lock:
            self.enqueued += n

    def add_report(self, report: Report) -> None:
        """One job whose handler ran: its pickup latency, and one completion."""
        self.pickup.add(report.pickup_ms, time.monotonic())
        with self.lock:
            self.completed += 1


class Adapter:
    """One replica: the supervisor, the threads, the sampler."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.emitter = Emitter(SYSTEM, settings.instance_id)
        self.stats = Stats()
        self.stop = threading.Event()
        self.tokens: queue_mod.Queue[int] = queue_mod.Queue()
        self.bin = Path(sys.executable).parent
        self.socket_dir = tempfile.mkdtemp(prefix="brooq-bench-")
        self.socket_path = os.path.join(self.socket_dir, "reports.sock")
        self.supervisor: subprocess.Popen[bytes] | None = None

    # ── start ──

    def migrate(self) -> None:
        """``brooq migrate up``; retried while another replica holds the migration lock."""
        deadline = time.monotonic() + 45
        while True:
            res = subprocess.run(
                [str(self.bin / "brooq"), "migrate", "up"],
                stdout=sys.stderr,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
            )
            if res.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"brooq migrate up failed: {res.stderr.strip()}")
            time.sleep(1)

    def describe(self) -> None:
        """The descriptor: brooq's tables and their btree indexes as the database has them."""
        with psycopg.connect(self.settings.database_url, autocommit=True) as conn:
            rows = conn.execute(TABLES_SQL).fetchall()
            plain = [name for name, kind in rows if kind == "r"]
            indexes = [r[0] for r in conn.execute(INDEXES_SQL, (plain,)).fetchall()]
        migrations = importlib.resources.files("brooq.postgres").joinpath("migrations")
        applied = sorted(
            p.name.removesuffix(".sql")
            for p in migrations.iterdir()
            if p.name.endswith(".sql") and not p.name.endswith(".rollback.sql")
        )
        self.emitter.descriptor(
            event_tables=[qualified(name) for name, _ in rows],
            event_indexes=[qualified(name) for name in indexes],
            extensions=[],
            version=f"brooq {brooq.__version__}",
            schema_version=applied[-1] if applied else "",
            db_name=self.settings.db_name,
        )

    def start_supervisor(self) -> None:
        """``brooq supervise`` on the app, as a child that dies with this process."""
        env = dict(os.environ)
        env["BROOQ_BENCH_SOCKET"] = self.socket_path
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent)])
        env.setdefault("HTTP_ADDR", "127.0.0.1:0")  # replicas must not share a port
        argv = [
            str(self.bin / "brooq"),
            "supervise",
            "--app",
            "bench_app:queue",
            "--workers",
            str(self.settings.worker_count),
            "--graceful-timeout",
            f"{GRACEFUL_S}s",
        ]
        self.supervisor = subprocess.Popen(
            argv, cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr,
            start_new_session=True,  # signals come from this process only, never twice
            preexec_fn=die_with_parent,
        )  # fmt: skip

    # ── threads ──

    def read_tokens(self) -> None:
        """The harness's ENQUEUE tokens; its closing stdin means the run is over."""
        for line in sys.stdin:
            n = parse_token(line)
            if n:
                self.tokens.put(n)
        self.stop.set()

    def next_batch(self, credit: Credit) -> int:
        """How many jobs to insert now (0: nothing yet), by the pacing the harness chose."""
        s = self.settings
        if s.producer_mode == "depth-target":
            with self.stats.lock:
                self.stats.target_rate = 0.0
                owed = s.target_depth - self.stats.ready
            if owed <= 0:
                time.sleep(0.05)
            return max(0, owed)
        rate = s.current_rate()
        with self.stats.lock:
            self.stats.target_rate = float(rate)
        if s.harness_paced:
            try:
                return self.tokens.get(timeout=0.5)
            except queue_mod.Empty:
                return 0
        time.sleep(max(0.0, s.batch_ms / 1000.0 - (time.monotonic() - credit.last)))
        return credit.take(time.monotonic(), rate, s.batch_max)

    def produce(self) -> None:
        """Insert what the pacing asks for, ``PRODUCER_BATCH_MAX`` jobs per enqueue_many."""
        s = self.settings
        q = brooq.Queue(s.database_url)
        credit = Credit(time.monotonic())
        seq = 0
        last_error = 0.0
        while not self.stop.is_set():
            owed = self.next_batch(credit)
            while owed > 0 and not self.stop.is_set():
                n = min(owed, s.batch_max)
                owed -= n
                jobs = [
                    brooq.Job(topic=TOPIC, payload=payload(seq + i, time.time(), s.payload_bytes))
                    for i in range(n)
                ]
                seq += n
                try:
                    q.enqueue_many(jobs)
                except Exception as exc:  # the database restarting, a backend killed
                    with self.stats.lock:
                        self.stats.enqueue_failures += n
                    if time.monotonic() - last_error > 5:
                        log.warning("enqueue of %d jobs failed: %s", n, exc)
                        last_error = time.monotonic()
                    time.sleep(0.2)
                    continue
                self.stats.add_enqueued(n)
        q.close()

    def receive(self, sock: socket.socket) -> None:
        """The handlers' reports, until the end."""
        sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                data = sock.recv(256)
            except TimeoutError:
                continue
            report = Report.decode(data)
            if report is not None:
                self.stats.add_report(report)

    def poll_depth(self) -> None:
        """Ready and running jobs of the topic (replica 0 only), every second."""
        period = 0.2 if self.settings.producer_mode == "depth-target" else 1.0
        conn: psycopg.Connection[tuple[int, int]] | None = None
        while not self.stop.wait(period):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.settings.database_url, autocommit=True)
                row = conn.execute(READY_SQL, {"topic": TOPIC}).fetchone()
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
                continue
            if row is not None:
                with self.stats.lock:
                    self.stats.ready, self.stats.running = int(row[0]), int(row[1])
        if conn is not None:
            conn.close()

    # ── the sampler ──

    def emit(self, since: float, last_enqueued: int, last_completed: int) -> tuple[int, int]:
        """One tick's samples; the counters as they are now."""
        every = float(self.settings.sample_every_s)
        dt = max(0.001, time.monotonic() - since)
        p50, p95, p99 = self.stats.pickup.percentiles((0.50, 0.95, 0.99), time.monotonic())
        with self.stats.lock:
            enqueued, completed = self.stats.enqueued, self.stats.completed
            ready, running, target = self.stats.ready, self.stats.running, self.stats.target_rate
        metrics = [
            ("claim_p50_ms", p50, PICKUP_WINDOW_S),
            ("claim_p95_ms", p95, PICKUP_WINDOW_S),
            ("claim_p99_ms", p99, PICKUP_WINDOW_S),
            ("enqueue_rate", (enqueued - last_enqueued) / dt, every),
            ("completion_rate", (completed - last_completed) / dt, every),
            ("queue_depth", float(ready), 0.0),
            ("running_depth", float(running), 0.0),
            ("producer_target_rate", target, 0.0),
        ]
        for metric, value, window_s in metrics:
            if metric in OBSERVER_METRICS and not self.settings.observer:
                continue
            self.emitter.sample(metric, value, window_s)
        return enqueued, completed

    def sample_until_stopped(self) -> int:
        """Emit on every clock-aligned tick until stopped (0) or the supervisor dies (1)."""
        every = self.settings.sample_every_s
        tick = next_tick(time.time(), every)
        since, enqueued, completed = time.monotonic(), 0, 0
        while not self.stop.is_set():
            self.stop.wait(max(0.0, min(0.5, tick - time.time())))
            assert self.supervisor is not None
            if self.supervisor.poll() is not None and not self.stop.is_set():
                log.error("brooq supervise exited by itself (%s)", self.supervisor.returncode)
                self.stop.set()
                return 1
            if time.time() >= tick and not self.stop.is_set():
                enqueued, completed = self.emit(since, enqueued, completed)
                since = time.monotonic()
                tick = max(tick + every, next_tick(time.time(), every))
        return 0

    # ── the end ──

    def stop_supervisor(self) -> None:
        """SIGTERM, then SIGKILL if it is still there after its grace and a second."""
        sup = self.supervisor
        if sup is None or sup.poll() is not None:
            return
        sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(GRACEFUL_S + 1)
        except subprocess.TimeoutExpired:
            sup.kill()
            sup.wait()

    def tally(self) -> None:
        """The topic's rows by state, and how many ran more than once, on stderr."""
        try:
            with psycopg.connect(self.settings.database_url, connect_timeout=2) as conn:
                conn.execute("SET statement_timeout = '2s'")
                rows = conn.execute(TALLY_SQL, (TOPIC,)).fetchall()
        except psycopg.Error as exc:
            log.warning("no tally: %s", exc)
            return
        with self.stats.lock:
            counts = f"enqueued {self.stats.enqueued}, reported {self.stats.completed}"
            failures = self.stats.enqueue_failures
        states = ", ".join(f"{state} {n} (run more than once: {again})" for state, n, again in rows)
        # One write, so that two replicas stopping together do not interleave their lines.
        sys.stderr.write(
            f"[brooq] replica {self.settings.instance_id}: {counts}, enqueue failures "
            f"{failures}; rows of {TOPIC}: {states}\n"
        )
        sys.stderr.flush()

    def run(self) -> int:
        """The whole life of the replica; its exit code."""
        self.migrate()
        self.describe()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(self.socket_path)
        self.start_supervisor()
        threads = [
            threading.Thread(target=self.produce, name="producer", daemon=True),
            threading.Thread(target=self.receive, args=(sock,), name="receiver", daemon=True),
        ]
        if self.settings.observer:
            threads.append(threading.Thread(target=self.poll_depth, name="depth", daemon=True))
        if self.settings.harness_paced:
            threads.append(threading.Thread(target=self.read_tokens, name="tokens", daemon=True))
        for thread in threads:
            thread.start()
        try:
            code = self.sample_until_stopped()
        finally:
            self.stop.set()
            self.stop_supervisor()
            deadline = time.monotonic() + 1.0  # the contract's 5 s, all told
            for thread in threads:
                if thread.name != "tokens":  # blocked on stdin; a daemon, it ends with us
                    thread.join(timeout=max(0.0, deadline - time.monotonic()))
            self.tally()
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
                os.rmdir(self.socket_dir)
        return code


def die_with_parent() -> None:
    """In the forked child: SIGKILL when the adapter dies (prctl PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)


def main() -> int:
    """Read the contract's settings, run the replica until SIGTERM."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[brooq-bench] %(message)s")
    settings = Settings.from_env(os.environ)
    adapter = Adapter(settings)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        adapter.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return adapter.run()


if __name__ == "__main__":
    raise SystemExit(main())
