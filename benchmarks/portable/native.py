"""Run hardbyte/postgresql-job-queue-benchmarking natively: no Docker, a local PostgreSQL.

The harness (``bench.py``) starts its PostgreSQL with ``docker compose`` and launches
most adapters with ``docker run --network host``. This launcher imports the harness
from its checkout, changes nothing in its files, and swaps at run time:

- the PostgreSQL lifecycle (``start_postgres``, ``stop_postgres`` and the three
  chaos helpers of ``orchestrator``) for a local cluster run as the ``postgres`` OS
  user with ``pg_ctl``: the same port (15555), role ``bench``/``bench`` (a
  superuser, as in the image) and the harness's ``postgres.conf``, but listening on
  localhost only. ``stop_postgres`` deletes the cluster, as ``docker compose down
  -v`` deletes the volume, so each system starts on a fresh one (``KEEP_DB=1``
  keeps it);
- the adapter registry: ``brooq`` and ``pgqueuer`` (this folder's adapters) and the
  harness's own ``procrastinate`` adapter, each launched as a local process with
  the Python of its own venv instead of a container.

    python native.py pg start|stop|wipe|status    the cluster alone
    python native.py run <bench run arguments>    ``bench.py run`` with the swaps; with
                                                  ``--scale F`` every phase of the named
                                                  scenarios lasts F times as long (>= 10 s)
    python native.py <other bench.py command>     ``combine`` / ``compare``, unchanged

Environment: ``HARNESS_DIR`` (the harness checkout, required), ``NATIVE_ROOT`` (the
venvs, default /tmp/harness-native), ``HARNESS_PGDIR`` (default /tmp/harness-pg),
``PG_BIN`` (default /usr/lib/postgresql/15/bin). ``run_native.sh`` sets them up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BROOQ_DIR = HERE.parent.parent
NATIVE_ROOT = Path(os.environ.get("NATIVE_ROOT", "/tmp/harness-native"))
PG_DIR = Path(os.environ.get("HARNESS_PGDIR", "/tmp/harness-pg"))
PG_DATA = PG_DIR / "data"
PG_LOG = PG_DIR / "server.log"
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_OS_USER = "postgres"
PG_PORT = 15555
NATIVE_PG_IMAGE = "native-postgresql"

# What this machine's cluster changes from the harness's postgres.conf: loopback only
# (the image listens on '*' inside its container), the harness's port, a socket folder
# the postgres user owns.
PG_OVERRIDES = f"""
# run_native.sh: after the harness's postgres.conf, so these win
listen_addresses = 'localhost'
port = {PG_PORT}
unix_socket_directories = '{PG_DIR}'
"""

# The image's POSTGRES_USER=bench: a superuser with a database of its own.
BENCH_ROLE_SQL = r"""
SELECT 'CREATE ROLE bench SUPERUSER LOGIN PASSWORD ''bench'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'bench') \gexec
SELECT 'CREATE DATABASE bench OWNER bench'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'bench') \gexec
"""

# system -> (venv folder under NATIVE_ROOT, adapter folder, script)
NATIVE_ADAPTERS: dict[str, tuple[str, str, str]] = {
    "brooq": ("venv-brooq", "brooq-bench", "main.py"),
    "pgqueuer": ("venv-pgqueuer", "pgqueuer-bench", "main.py"),
    "procrastinate": ("venv-procrastinate", "procrastinate-bench", "main.py"),
}
# The adapters whose folder is the harness's, not this one.
HARNESS_ADAPTERS = {"procrastinate"}
# The adapters that pace themselves and never read stdin. The harness's pacer would
# fill their stdin pipe (64 KiB: under 3 minutes of ENQUEUE tokens at 200 jobs/s), block
# in a write holding the pipe's lock, and the harness would then hang for good when it
# closes that pipe to stop the adapter (the pipe's close waits for the lock). So they get
# PRODUCER_PACING=adapter, which also keeps the harness's pacer off for them.
SELF_PACED_ADAPTERS = {"procrastinate"}


def harness_dir() -> Path:
    """The harness checkout named by HARNESS_DIR (it must hold bench.py)."""
    raw = os.environ.get("HARNESS_DIR", "")
    if not raw:
        raise SystemExit("HARNESS_DIR is not set: point it at the harness checkout")
    path = Path(raw).resolve()
    if not (path / "bench.py").is_file():
        raise SystemExit(f"HARNESS_DIR={path} holds no bench.py: is it the harness checkout?")
    return path


# ─── the local PostgreSQL ────────────────────────────────────────────────


def as_postgres(
    argv: list[str], check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as the postgres OS user (PostgreSQL refuses to run as root)."""
    cmd = argv if os.geteuid() != 0 else ["runuser", "-u", PG_OS_USER, "--", *argv]
    res = subprocess.run(cmd, text=True, capture_output=True, input=stdin, check=False)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def pg_running() -> bool:
    """Whether a postmaster runs on PG_DATA."""
    if not (PG_DATA / "PG_VERSION").exists():
        return False
    status = as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(PG_DATA), "status"], check=False)
    return status.returncode == 0


def pg_init(harness: Path) -> None:
    """Create the cluster (once): the harness's postgres.conf, then PG_OVERRIDES."""
    if (PG_DATA / "PG_VERSION").exists():
        return
    PG_DIR.mkdir(parents=True, exist_ok=True)
    shutil.chown(PG_DIR, PG_OS_USER, PG_OS_USER)
    conf = PG_DIR / "harness-postgres.conf"
    shutil.copyfile(harness / "postgres.conf", conf)
    shutil.chown(conf, PG_OS_USER, PG_OS_USER)
    as_postgres(
        [str(PG_BIN / "initdb"), "-D", str(PG_DATA), "-U", PG_OS_USER, "-E", "UTF8",
         "--auth-local=peer", "--auth-host=scram-sha-256"]
    )  # fmt: skip
    with (PG_DATA / "postgresql.conf").open("a") as fh:
        fh.write(f"\ninclude '{conf}'\n{PG_OVERRIDES}")


def pg_start(harness: Path) -> None:
    """Create the cluster if needed, start it, make sure role bench exists; wait until ready."""
    pg_init(harness)
    if not pg_running():
        as_postgres(
            [str(PG_BIN / "pg_ctl"), "-D", str(PG_DATA), "-l", str(PG_LOG), "-w", "-t", "60",
             "start"]
        )  # fmt: skip
    as_postgres(
        [str(PG_BIN / "psql"), "-h", str(PG_DIR), "-p", str(PG_PORT), "-d", "postgres",
         "-v", "ON_ERROR_STOP=1", "-q", "-f", "-"],
        stdin=BENCH_ROLE_SQL,
    )  # fmt: skip
    wait_query_ready()


def wait_query_ready(timeout_s: float = 60.0) -> None:
    """Wait until role bench can run a query over TCP, as the harness will."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    url = f"postgres://bench:bench@localhost:{PG_PORT}/postgres"
    while True:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.Error as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"local PostgreSQL not query-ready: {exc}") from exc
            time.sleep(0.5)


def pg_stop() -> None:
    """Stop the cluster (fast shutdown, as ``docker compose stop`` does with the image)."""
    if pg_running():
        as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(PG_DATA), "-m", "fast", "-w", "stop"])


def pg_wipe() -> None:
    """Stop the cluster and delete it (the next start makes a fresh one)."""
    pg_stop()
    shutil.rmtree(PG_DATA, ignore_errors=True)


# ─── the swaps ───────────────────────────────────────────────────────────


def patch_postgres(orch: Any, harness: Path) -> None:
    """Replace the orchestrator's docker-compose lifecycle with the local cluster's."""

    def start_postgres(pg_image: str) -> None:
        pg_start(harness)

    def stop_postgres(pg_image: str) -> None:
        if os.environ.get("KEEP_DB"):
            print("[native] KEEP_DB set: leaving the local PostgreSQL running", file=sys.stderr)
            return
        pg_wipe()

    def chaos_stop(pg_image: str) -> None:
        print("[native] stopping the local PostgreSQL (chaos)", file=sys.stderr)
        pg_stop()

    def chaos_start(pg_image: str) -> None:
        print("[native] starting the local PostgreSQL (chaos)", file=sys.stderr)
        pg_start(harness)

    def chaos_restart(pg_image: str) -> None:
        chaos_stop(pg_image)
        chaos_start(pg_image)

    orch.start_postgres = start_postgres
    orch.stop_postgres = stop_postgres
    orch._compose_stop_postgres = chaos_stop
    orch._compose_start_postgres = chaos_start
    orch._restart_postgres = chaos_restart


def adapter_dir(system: str, harness: Path) -> Path:
    """The folder holding ``system``'s adapter.json and script."""
    folder = NATIVE_ADAPTERS[system][1]
    return (harness if system in HARNESS_ADAPTERS else HERE) / folder


def venv_python(system: str) -> Path:
    """The Python of ``system``'s own venv (made by ``run_native.sh setup``)."""
    python = NATIVE_ROOT / NATIVE_ADAPTERS[system][0] / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: run `run_native.sh setup` first")
    return python


def installed_version(system: str, package: str) -> str | None:
    """``package``'s version in ``system``'s venv, or None."""
    res = subprocess.run(
        [str(venv_python(system)), "-c",
         f"import importlib.metadata as m; print(m.version({package!r}))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return res.stdout.strip() or None


def git(*args: str) -> str | None:
    """``git args`` in the brooq checkout; None when it fails."""
    res = subprocess.run(
        ["git", "-C", str(BROOQ_DIR), *args], capture_output=True, text=True, check=False
    )
    return res.stdout.strip() if res.returncode == 0 else None


def revision(system: str) -> dict[str, Any]:
    """What the harness records as the code under test (manifest.json, README.md)."""
    package = {"brooq": "brooq", "pgqueuer": "pgqueuer", "procrastinate": "procrastinate"}[system]
    block: dict[str, Any] = {
        "source": f"native venv {NATIVE_ROOT / NATIVE_ADAPTERS[system][0]}",
        "library": package,
        "pinned_version": installed_version(system, package),
    }
    if system == "brooq":
        block["git_short"] = git("rev-parse", "--short", "HEAD")
        block["git_branch"] = git("rev-parse", "--abbrev-ref", "HEAD")
        block["dirty"] = bool(git("status", "--porcelain"))
    return block


def patch_adapters(adapters: Any, versions: Any, harness: Path) -> None:
    """Register brooq, pgqueuer and procrastinate as local processes."""

    def launcher(system: str) -> Callable[[Any, dict[str, str]], Any]:
        def launch(manifest: Any, overrides: dict[str, str]) -> Any:
            if system in SELF_PACED_ADAPTERS:
                # The orchestrator decides on its pacer from this very dict after the
                # launcher returns (bench_harness/orchestrator.py, _launch_one_replica).
                overrides["PRODUCER_PACING"] = "adapter"
            folder = adapter_dir(system, harness)
            script = str(folder / NATIVE_ADAPTERS[system][2])
            env = adapters._base_env(manifest, overrides)
            return adapters.LaunchSpec(
                argv=[str(venv_python(system)), script], env=env, cwd=str(folder)
            )

        return launch

    def builder(system: str) -> Callable[[bool], None]:
        def build(skip: bool) -> None:
            venv_python(system)  # the venvs are built by run_native.sh setup

        return build

    for system in NATIVE_ADAPTERS:
        adapters.ADAPTERS[system] = adapters.AdapterEntry(
            bench_dir=adapter_dir(system, harness),
            builder=builder(system),
            launcher=launcher(system),
        )
        versions._CAPTURE[system] = lambda system=system: revision(system)


def take_scale(argv: list[str]) -> tuple[list[str], float | None]:
    """``argv`` without ``--scale F`` / ``--scale=F``, and F (None when absent)."""
    rest: list[str] = []
    factor: float | None = None
    args = iter(argv)
    for arg in args:
        if arg == "--scale" or arg.startswith("--scale="):
            raw = arg.partition("=")[2] or next(args, "")
            try:
                factor = float(raw)
            except ValueError:
                raise SystemExit(f"--scale {raw!r}: not a number") from None
            if factor <= 0:
                raise SystemExit(f"--scale {raw!r}: must be above 0")
        else:
            rest.append(arg)
    return rest, factor


def scale_scenarios(phases: Any, factor: float) -> None:
    """Make every named scenario's phases ``factor`` times as long.

    At least 10 s each, and a warmup at least the adapters' 30 s pickup window, so
    that the start's latencies are out of the window when the first measured phase
    begins.
    """
    for name, specs in phases.SCENARIOS.items():
        scaled = []
        for spec in specs:
            head, _, duration = spec.rpartition(":")
            kind = head.partition("=")[2].partition("(")[0]
            floor = 30 if kind == "warmup" else 10
            seconds = max(floor, round(phases.parse_duration(duration) * factor))
            scaled.append(f"{head}:{seconds}s")
        phases.SCENARIOS[name] = scaled


def main(argv: list[str]) -> int:
    """``pg …`` manages the cluster; anything else goes to the harness's CLI, swapped."""
    harness = harness_dir()
    if argv[:1] == ["pg"]:
        action = argv[1] if len(argv) > 1 else "status"
        if action == "start":
            pg_start(harness)
        elif action == "stop":
            pg_stop()
        elif action == "wipe":
            pg_wipe()
        elif action == "status":
            print("running" if pg_running() else "stopped")
        else:
            raise SystemExit(f"unknown pg action {action!r}: start, stop, wipe or status")
        return 0
    sys.path.insert(0, str(harness))
    from bench_harness import (  # type: ignore[import-not-found]  # the harness checkout
        adapters,
        orchestrator,
        phases,
        versions,
    )

    patch_postgres(orchestrator, harness)
    patch_adapters(adapters, versions, harness)
    argv, factor = take_scale(argv)
    if factor is not None:
        scale_scenarios(phases, factor)
    if argv[:1] == ["run"] and not any(a.startswith("--pg-image") for a in argv):
        argv = [*argv, "--pg-image", NATIVE_PG_IMAGE]
    result: int = orchestrator.main(argv)
    return result


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
