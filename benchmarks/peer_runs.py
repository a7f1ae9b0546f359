"""The harness side of the peer drains: start the peer's workers, run its driver, measure CPU.

A peer's driver (``drain`` of benchmarks/peer_pgqueuer.py or
benchmarks/peer_celery.py, run by the peer's own interpreter) loads what it
must, prints ``loaded``, and waits; the harness then snapshots the CPU of
every process of the system (benchmarks/cpu.py) and writes ``go``; the
driver makes the jobs takeable, starts the clock, counts the jobs already
done, polls until none is left and prints ``{"seconds": …,
"done_at_start": …}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg

from benchmarks.cpu import CpuProbe, CpuUsage
from benchmarks.harness import ROOT, Context, children_of
from benchmarks.redis_server import RedisServer

PGQUEUER_SCRIPT = ROOT / "benchmarks" / "peer_pgqueuer.py"
CELERY_SCRIPT = ROOT / "benchmarks" / "peer_celery.py"
CELERY_PREFETCH = 64
CELERY_TASKS = {False: "bench.noop", True: "bench.cpu"}
READY_TIMEOUT_S = 60.0
LOAD_TIMEOUT_S = 600.0
DRAIN_TIMEOUT_S = 3600.0  # the drivers give up themselves after 60 s without progress


@dataclass
class PeerDrain:
    """What one peer drain measured."""

    seconds: float
    done_at_start: int
    cpu: CpuUsage


class Lines:
    """Whole lines from a process's stdout, each within a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes], what: str) -> None:
        assert proc.stdout is not None
        self.fd, self.proc, self.what, self.buf = proc.stdout.fileno(), proc, what, b""

    def next(self, timeout: float, alive: Callable[[], bool] = lambda: True) -> str:
        """The next line; raises when it does not come in time or a worker died."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.what}: nothing after {timeout:.0f}s")
            if not alive():
                raise RuntimeError(f"{self.what}: a worker exited")
            if select.select([self.fd], [], [], 0.2)[0]:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise RuntimeError(f"{self.what} exited (code {self.proc.wait(10)})")
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace").strip()


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-1500:]
    return ""


def run_driver(
    cmd: Sequence[str],
    log: Path,
    probe: Callable[[str], CpuProbe],
    alive: Callable[[], bool],
    env: dict[str, str] | None = None,
) -> tuple[dict[str, float], CpuUsage]:
    """Run a peer's ``drain`` driver: ``probe(loaded line)`` just before "go"; its result."""
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env
        )
    try:
        lines = Lines(proc, "the peer's driver")
        loaded = lines.next(LOAD_TIMEOUT_S, alive)
        if not loaded.startswith("loaded"):
            raise RuntimeError(f"the peer's driver said {loaded!r}")
        started = probe(loaded)
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        result = json.loads(lines.next(DRAIN_TIMEOUT_S, alive))
        return result, started.finish()
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{_tail(log)}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM its process group; SIGKILL after ``timeout``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def as_url(dsn: str) -> str:
    """A ``postgresql://`` URL for a libpq DSN (asyncpg takes only URLs)."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host, port = params.pop("host", "localhost"), params.pop("port", None)
    dbname = quote(str(params.pop("dbname", "")), safe="")
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return (
        f"postgresql://{auth}{host}"
        + (f":{port}" if port else "")
        + f"/{dbname}"
        + (f"?{query}" if query else "")
    )


def pgqueuer_drain(ctx: Context, py: Path, workers: int, jobs: int, cpu_ms: float) -> PeerDrain:
    """``workers`` pgqueuer processes drain ``jobs`` jobs (each ``cpu_ms`` of CPU, or none)."""
    script = str(PGQUEUER_SCRIPT)
    with ctx.server.empty("peer_pgqueuer") as dsn:
        url = as_url(dsn)
        subprocess.run([str(py), script, "install", url], check=True, capture_output=True)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(workers):
                with open(ctx.workdir / f"pgqueuer-{os.getpid()}-{i}.log", "ab") as log:
                    procs.append(
                        subprocess.Popen(
                            [str(py), script, "work", url, str(ctx.sizes.peer_batch), str(cpu_ms)],
                            stdout=subprocess.PIPE,
                            stderr=log,
                            start_new_session=True,
                        )
                    )
            for proc in procs:
                if Lines(proc, "a pgqueuer worker").next(READY_TIMEOUT_S) != "ready":
                    raise RuntimeError("a pgqueuer worker did not start; see its log")
            time.sleep(0.5)  # let each reach its LISTEN wait
            with psycopg.connect(dsn, autocommit=True) as conn:

                def probe(loaded: str) -> CpuProbe:
                    driver = int(loaded.split()[1])  # its backend is not pgqueuer's
                    return CpuProbe(conn, {"workers": [p.pid for p in procs]}, exclude=[driver])

                result, usage = run_driver(
                    [str(py), script, "drain", url, str(jobs)],
                    ctx.workdir / f"pgqueuer-driver-{os.getpid()}.log",
                    probe,
                    alive=lambda: all(p.poll() is None for p in procs),
                )
            return PeerDrain(float(result["seconds"]), int(result["done_at_start"]), usage)
        finally:
            for proc in procs:
                stop_group(proc, 15)


def _wait_celery_ready(worker: subprocess.Popen[bytes], state: Path, workers: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ((state / "ready").exists() and len(list(state.glob("child-*"))) >= workers):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the Celery worker did not get ready; see its log")
        time.sleep(0.05)


def celery_worker_args(workers: int) -> list[str]:
    """``celery worker``'s arguments: prefork, concurrency N, quiet (no per-task log lines,
    as brooq by default), no gossip, mingle or heartbeat (one worker: nothing to talk to)."""
    return [
        "worker",
        "--pool",
        "prefork",
        "--concurrency",
        str(workers),
        "--loglevel",
        "WARNING",
        "--queues",
        "bench",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--hostname",
        f"bench{os.getpid()}@localhost",
    ]


def celery_drain(ctx: Context, py: Path, workers: int, jobs: int, cpu_ms: float) -> PeerDrain:
    """One Celery prefork worker (concurrency ``workers``) on a private Redis drains ``jobs``."""
    redis = RedisServer(ctx.workdir).start()
    # The app runs from a copy: benchmarks/ on sys.path would shadow modules (profile.py).
    state = Path(tempfile.mkdtemp(prefix="celery-", dir=ctx.workdir))
    shutil.copy(CELERY_SCRIPT, state / "peer_celery.py")
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CELERY_CONFIG_MODULE")},
        "PYTHONPATH": str(state),
        "BENCH_REDIS_URL": redis.url,
        "BENCH_CPU_MS": str(cpu_ms),
        "BENCH_CELERY_STATE": str(state),
        "BENCH_CELERY_PREFETCH": str(CELERY_PREFETCH),
    }
    worker: subprocess.Popen[bytes] | None = None
    try:
        with open(state / "worker.log", "ab") as log:
            worker = subprocess.Popen(
                [str(py), "-m", "celery", "-A", "peer_celery", *celery_worker_args(workers)],
                cwd=state,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        _wait_celery_ready(worker, state, workers)
        time.sleep(0.5)  # let the worker reach its BRPOP
        main = worker

        def probe(loaded: str) -> CpuProbe:
            pool = children_of(main.pid)
            return CpuProbe(None, {"parent": [main.pid], "workers": pool, "redis": [redis.pid]})

        result, usage = run_driver(
            [str(py), str(state / "peer_celery.py"), "drain", str(jobs), CELERY_TASKS[cpu_ms > 0]],
            state / "driver.log",
            probe,
            alive=lambda: main.poll() is None,
            env=env,
        )
        # A warm shutdown (SIGTERM to the main process alone, as Celery's docs say): the pool
        # processes finish and each writes what it ran.
        os.kill(worker.pid, signal.SIGTERM)
        worker.wait(60)
        ran = sum(int(p.read_text() or 0) for p in state.glob("count-*"))
        if ran != jobs:
            raise RuntimeError(f"Celery ran {ran} of {jobs} tasks (see {state}/worker.log)")
        return PeerDrain(float(result["seconds"]), int(result["done_at_start"]), usage)
    finally:
        if worker is not None and worker.poll() is None:
            stop_group(worker)
        redis.stop()
