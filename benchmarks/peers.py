"""Optional peers (``--peers pgqueuer`` / ``make bench PEERS=pgqueuer``).

Each peer gets its own venv under benchmarks/.peers/<name>/ (git-ignored),
installed from PyPI with pip; when that fails the reason is printed and the
run goes on without it. pgqueuer runs in its best documented configuration:
the asyncpg driver, batch size 10, N worker processes (one QueueManager and
connection each), its schema durable (logged tables) like brooq's.

Timing mirrors brooq's drain: workers start and say ready, 20,000 no-op
jobs are enqueued in one statement (pgqueuer's own ``enqueue`` with lists;
its insert trigger NOTIFYs), the clock starts at the wall-clock time the
enqueue call returned, and stops at the first 50 ms poll that finds the
queue table empty (pgqueuer deletes a job when it completes and logs it in
``pgqueuer_log``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import psycopg

from benchmarks.harness import ROOT, Context

GROUP = "peers (same drain, same server)"
PEERS = {"pgqueuer": ["pgqueuer", "asyncpg"]}
PEERS_DIR = ROOT / "benchmarks" / ".peers"
SCRIPT = {"pgqueuer": ROOT / "benchmarks" / "peer_pgqueuer.py"}


def python_of(name: str) -> Path:
    """The interpreter of peer ``name``'s venv."""
    return PEERS_DIR / name / "bin" / "python"


def _install(name: str) -> str:
    """Create the venv and pip install the peer; its version. Raises with the reason."""
    venv = PEERS_DIR / name
    py = python_of(name)
    if not py.exists():
        subprocess.run(
            [sys.executable, "-m", "venv", str(venv)],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
    probe = [str(py), "-c", f"import importlib.metadata as m; print(m.version({name!r}))"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        return done.stdout.strip()
    pip = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", *PEERS[name]],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if pip.returncode != 0:
        raise RuntimeError(
            f"pip install {' '.join(PEERS[name])} failed:\n{(pip.stderr or pip.stdout)[-2000:]}"
        )
    return subprocess.run(
        probe, capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()


def prepare(ctx: Context) -> None:
    """Install every requested peer; drop (and say why) the ones that cannot be installed."""
    for name in list(ctx.peers):
        print(f"peers: preparing {name} in {PEERS_DIR / name}", file=sys.stderr, flush=True)
        try:
            version = _install(name)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            detail = getattr(exc, "stderr", None) or str(exc)
            print(f"peers: {name} is skipped: could not install it: {detail}", file=sys.stderr)
            ctx.results.notes[f"peer {name}"] = f"skipped: could not install: {str(exc)[:300]}"
            ctx.peers.remove(name)
            continue
        ctx.results.notes[f"peer {name}"] = (
            f"{name} {version}, asyncpg driver, batch size 10, one process per worker"
        )


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


def _run(py: Path, *args: str, timeout: float = 120) -> str:
    done = subprocess.run([str(py), *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def pgqueuer_drain(ctx: Context, dsn: str, workers: int, jobs: int, batch: int) -> float:
    """Seconds for ``workers`` pgqueuer processes to complete ``jobs`` no-op jobs."""
    py, script, url = python_of("pgqueuer"), str(SCRIPT["pgqueuer"]), as_url(dsn)
    _run(py, script, "install", url)
    procs: list[subprocess.Popen[str]] = []
    logs = []
    try:
        for i in range(workers):
            log = open(ctx.workdir / f"pgqueuer-{os.getpid()}-{i}.log", "w")  # noqa: SIM115
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [str(py), script, "work", url, str(batch)],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    start_new_session=True,
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a pgqueuer worker did not start; see its log")
        time.sleep(0.5)  # let each reach its LISTEN wait
        started = float(_run(py, script, "enqueue", url, str(jobs)).strip())
        with psycopg.connect(dsn, autocommit=True) as conn:
            last, last_change = -1, time.monotonic()
            while True:
                row = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
                left = int(row[0]) if row else 0
                now = time.time()
                if left == 0:
                    break
                if left != last:
                    last, last_change = left, time.monotonic()
                elif time.monotonic() - last_change > 60:
                    raise RuntimeError(f"pgqueuer stalled with {left} jobs left")
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a pgqueuer worker exited during the drain")
                time.sleep(0.05)
        return now - started
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for log in logs:
            log.close()


def run_peer(ctx: Context, round_no: int, name: str, workers: int) -> None:
    """One drain by peer ``name`` at ``workers`` processes."""
    jobs = ctx.sizes.drain_jobs
    with ctx.server.empty(f"peer_{name}") as dsn:
        seconds = pgqueuer_drain(ctx, dsn, workers, jobs, ctx.sizes.peer_batch)
    ctx.results.add(
        f"peer.{name}.N{workers}",
        jobs / seconds,
        round_no=round_no,
        group=GROUP,
        label=f"{name}: {workers} processes, asyncpg, batch {ctx.sizes.peer_batch}",
        unit="jobs/s",
    )
