"""Optional peers (``--peers pgqueuer,celery`` / ``make bench PEERS=pgqueuer,celery``).

Each peer gets its own venv under benchmarks/.peers/<name>/ (git-ignored),
installed from PyPI with pip, never into brooq's; Celery also needs Debian's
redis-server (benchmarks/redis_server.py). When either fails the reason is
printed and the run goes on without that peer.

- pgqueuer runs in its best documented configuration: the asyncpg driver,
  batch size 10, N worker processes (one QueueManager and connection each),
  its schema durable (logged tables) like brooq's.
- Celery 5 runs as a reference: one prefork worker with concurrency N, a
  private Redis as broker, no result backend, ``acks_late``, prefetch
  multiplier 64 (benchmarks/peer_celery.py says why).

Both drains are timed like brooq's (benchmarks/peer_runs.py): the workers
start and say ready, the jobs are made takeable at once (pgqueuer: one
``enqueue`` call, one statement; Celery: messages loaded into a list nobody
consumes, then renamed to the worker's queue in one Redis transaction), the
clock starts then, the jobs already done are counted at once (must be 0),
and the clock stops at the first 50 ms poll that finds nothing left.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import cpu, peer_runs, redis_server
from benchmarks.harness import ROOT, Context
from benchmarks.runs import record_drain

GROUP = "peers (same drain, same server)"
PEERS = {"pgqueuer": ["pgqueuer", "asyncpg"], "celery": ["celery[redis]>=5,<6"]}
PEERS_DIR = ROOT / "benchmarks" / ".peers"
DRIVERS = {"pgqueuer": peer_runs.pgqueuer_drain, "celery": peer_runs.celery_drain}


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


def _describe(name: str, version: str) -> str:
    if name == "pgqueuer":
        return f"pgqueuer {version}, asyncpg driver, batch size 10, one process per worker"
    binary = redis_server.ensure_installed()
    return (
        f"celery {version}, one prefork worker (concurrency = N), Redis "
        f"{redis_server.version(binary)} broker (private, no snapshots), no result backend, "
        f"acks_late, prefetch multiplier {peer_runs.CELERY_PREFETCH}"
    )


def prepare(ctx: Context) -> None:
    """Install every requested peer; drop (and say why) the ones that cannot be installed."""
    for name in list(ctx.peers):
        print(f"peers: preparing {name} in {PEERS_DIR / name}", file=sys.stderr, flush=True)
        try:
            ctx.results.notes[f"peer {name}"] = _describe(name, _install(name))
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            detail = getattr(exc, "stderr", None) or str(exc)
            print(f"peers: {name} is skipped: could not install it: {detail}", file=sys.stderr)
            ctx.results.notes[f"peer {name}"] = f"skipped: could not install: {str(exc)[:300]}"
            ctx.peers.remove(name)


LABELS = {
    "pgqueuer": "pgqueuer: {n} processes, asyncpg, batch {batch}",
    "celery": "Celery prefork: concurrency {n}, Redis, acks_late",
}


def run_peer(
    ctx: Context,
    round_no: int,
    name: str,
    workers: int,
    *,
    cpu_ms: float = 0.0,
    group: str = GROUP,
    prefix: str = "peer",
) -> None:
    """One drain by peer ``name`` at ``workers`` processes: ``<prefix>.<name>.N<workers>``.

    No-op jobs (``drain_jobs`` of them), or with ``cpu_ms`` the CPU-bound
    workload (``cpu_jobs``); its CPU per job goes into ``cpujob.…``.
    """
    jobs = ctx.sizes.cpu_jobs if cpu_ms else ctx.sizes.drain_jobs
    result = DRIVERS[name](ctx, python_of(name), workers, jobs, cpu_ms)
    label = LABELS[name].format(n=workers, batch=ctx.sizes.peer_batch)
    record_drain(
        ctx,
        round_no,
        f"{prefix}.{name}.N{workers}",
        group=group,
        label=label,
        jobs=jobs,
        seconds=result.seconds,
        done_at_start=result.done_at_start,
    )
    workload = f"cpu {cpu_ms:g} ms" if cpu_ms else "no-op"
    cpu.record_per_job(
        ctx,
        round_no,
        f"{'cpu' if cpu_ms else 'noop'}.{name}.N{workers}",
        f"{workload}, {label}",
        result.cpu,
        jobs,
    )
