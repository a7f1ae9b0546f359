"""A demo application and a self-running tour: ``python -m brooq.demo`` (``make demo``).

Kinds: ``demo.ok`` (succeeds), ``demo.flaky`` (fails its first attempts,
then succeeds), ``demo.poison`` (always fails: ends ``dead``), ``demo.slow``
(sleeps; some past their attempt timeout), ``demo.hang`` (ignores signals and
spins: killed by the watchdog), ``demo.crash`` (kills its own process). The
tour enqueues a few hundred jobs, runs ``brooq supervise --workers 4`` until
every one is settled, prints the outcomes and exits.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import brooq
from brooq.postgres.dsn import is_local
from brooq.postgres.store import PostgresStore

LOCAL_DATABASE_URL = "postgresql://brooq:brooq@127.0.0.1:55433/brooq"

queue = brooq.Queue(
    os.environ.get("DATABASE_URL") or LOCAL_DATABASE_URL,
    defaults=brooq.KindOptions(
        backoff_base=timedelta(milliseconds=50),
        backoff_max=timedelta(milliseconds=300),
        max_attempts=3,
    ),
)


@queue.kind("demo.ok")
def ok(claim: brooq.Claim) -> None:
    """Succeeds after a few milliseconds of work."""
    time.sleep(0.002)


@queue.kind("demo.flaky", max_attempts=4)
def flaky(claim: brooq.Claim) -> None:
    """Fails its first ``fail_times`` attempts, then succeeds."""
    if claim.attempt <= int(claim.payload.get("fail_times", 1)):
        raise RuntimeError(f"transient failure on attempt {claim.attempt} (demo)")


@queue.kind("demo.poison", max_attempts=2)
def poison(claim: brooq.Claim) -> None:
    """Always fails: reaches ``dead`` after max_attempts, with last_error saying why."""
    raise ValueError("this payload can never be processed (demo)")


@queue.kind("demo.slow", attempt_timeout="1s", max_attempts=2)
def slow(claim: brooq.Claim) -> None:
    """Sleeps; jobs asking for more than the 1s attempt timeout are interrupted."""
    time.sleep(float(claim.payload.get("seconds", 0.1)))


@queue.kind("demo.hang", attempt_timeout="1s", watchdog_grace="1s", max_attempts=1)
def hang(claim: brooq.Claim) -> None:
    """Ignores its timeout and spins, as a handler stuck in C code would: the supervisor
    SIGKILLs its process after the grace and records the failure."""
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        pass


@queue.kind("demo.crash", max_attempts=2)
def crash(claim: brooq.Claim) -> None:
    """Kills its own process, as a segfault or the OOM killer would: recorded, then ``dead``."""
    os.kill(os.getpid(), signal.SIGKILL)


MIX = (
    ("demo.ok", 0.68),
    ("demo.flaky", 0.15),
    ("demo.poison", 0.05),
    ("demo.slow", 0.08),
    ("demo.hang", 0.01),
    ("demo.crash", 0.03),
)


def demo_jobs(count: int, run: str, rng: random.Random) -> list[brooq.Job]:
    """``count`` jobs of the demo kinds in the proportions of MIX."""
    topics = rng.choices([t for t, _ in MIX], weights=[w for _, w in MIX], k=count - 2)
    topics += ["demo.hang", "demo.crash"]  # at least one of each, whatever the draw
    jobs = []
    for i, topic in enumerate(topics):
        payload: dict[str, object] = {"run": run, "n": i}
        if topic == "demo.flaky":
            payload["fail_times"] = rng.choice([1, 2])
        if topic == "demo.slow":
            payload["seconds"] = rng.choice([0.05, 0.2, 3.0])
        jobs.append(brooq.Job(topic=topic, payload=payload))
    return jobs


def worker_command(workers: int) -> list[str]:
    """The command that processes the demo jobs."""
    return [
        sys.executable,
        "-m",
        "brooq.cli",
        "supervise",
        "--app",
        "brooq.demo:queue",
        "--workers",
        str(workers),
    ]


def wait_settled(
    store: PostgresStore, ids: Sequence[str], timeout_s: float
) -> list[brooq.JobRecord]:
    """Poll until every job is terminal (or the timeout passes); their rows."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = [store.get(i) for i in ids]
        if all(r.state.is_terminal for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def print_errors(records: Sequence[brooq.JobRecord]) -> None:
    """One recorded last_error per topic of dead jobs: what the queue saw happen."""
    shown: dict[str, str] = {}
    for r in records:
        if str(r.state) == "dead" and r.topic not in shown:
            shown[r.topic] = f"{r.last_error} (attempts={r.attempts})"
    for topic, text in sorted(shown.items()):
        print(f"  {topic:<12} {text}")


def print_table(counts: Counter[tuple[str, str]]) -> None:
    """Outcomes per topic as a small table."""
    states = ["done", "dead", "canceled", "failed", "pending", "processing"]
    print(f"\n{'topic':<14}" + "".join(f"{s:>11}" for s in states))
    for topic in sorted({t for t, _ in counts}):
        print(f"{topic:<14}" + "".join(f"{counts.get((topic, s), 0):>11}" for s in states))
    total = sum(counts.values())
    print(f"{'total':<14}{total:>11} jobs\n")


INTENDED = """
The dead jobs here are intended: demo.poison always fails, demo.crash kills its own
process, demo.hang is killed by the watchdog, and demo.slow jobs that sleep past their
1s attempt timeout fail twice. Each dead row says why in last_error."""


def brooq_command() -> str:
    """The brooq executable next to this Python (the venv's), else ``python -m brooq.cli``."""
    beside = Path(sys.executable).parent / "brooq"
    if beside.exists():
        return shlex.quote(str(beside))
    return f"{shlex.quote(sys.executable)} -m brooq.cli"


def shown_url(dsn: str) -> str:
    """The DSN to paste when it names a database on this machine; else a placeholder.

    A remote DATABASE_URL carries a real password: it is never printed.
    """
    if is_local(dsn):
        return shlex.quote(dsn)
    return "'<the DATABASE_URL this demo used>'"


def next_steps(dsn: str, dead_id: str) -> str:
    """Commands that work when pasted into a shell: the venv's brooq, this database.

    In a venv the first one activates it, so that ``brooq``, ``python`` and
    ``pip`` are the venv's from then on (the README's quick start goes on from there).
    """
    activate = Path(sys.executable).parent / "activate"
    brooq_cmd = "brooq" if activate.is_file() else brooq_command()
    first = (
        [f"  . {shlex.quote(str(activate))}   # this venv first on PATH: its python, pip, brooq"]
        if activate.is_file()
        else []
    )
    lines = [
        "Next, paste these (the venv's brooq on the demo's database):",
        *first,
        f"  export DATABASE_URL={shown_url(dsn)}",
        f"  {brooq_cmd} status",
        f"  {brooq_cmd} jobs list --state dead --limit 5",
        f"  {brooq_cmd} job {dead_id}",
        f"  {brooq_cmd} jobs retry --state dead --topic demo.poison --dry-run --json",
        f"  {brooq_cmd} dashboard --http-addr 127.0.0.1:8091   # then open "
        "http://127.0.0.1:8091/ui (Ctrl-C stops it)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Enqueue demo jobs, process them with real workers, print the outcomes."""
    parser = argparse.ArgumentParser(prog="python -m brooq.demo", allow_abbrev=False)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    dsn = os.environ.get("DATABASE_URL") or LOCAL_DATABASE_URL
    store = PostgresStore(dsn)
    run = f"{os.getpid()}-{int(time.time())}"
    ids = [r.id for r in store.enqueue_many(demo_jobs(args.jobs, run, random.Random(run)))]
    print(f"enqueued {len(ids)} demo jobs (run {run}); processing…", flush=True)
    started = time.monotonic()
    env = {**os.environ, "DATABASE_URL": dsn, "LOG_LEVEL": os.environ.get("LOG_LEVEL", "error")}
    worker = subprocess.Popen(worker_command(args.workers), env=env)
    try:
        records = wait_settled(store, ids, args.timeout)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    counts = Counter((r.topic, str(r.state)) for r in records)
    print_table(counts)
    print("recorded last_error of dead jobs:")
    print_errors(records)
    print(INTENDED)
    print(f"\nsettled in {time.monotonic() - started:.1f}s")
    dead = next((r.id for r in records if str(r.state) == "dead"), ids[0])
    print(next_steps(dsn, dead))
    store.close()
    unsettled = sum(n for (_, s), n in counts.items() if s not in ("done", "dead", "canceled"))
    return 1 if unsettled else 0


if __name__ == "__main__":
    sys.exit(main())
