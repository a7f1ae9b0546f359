"""The built package works on its own: sdist and wheel from a copy of the checkout, the wheel
installed into a fresh venv, then — from a folder outside the checkout — ``brooq migrate up``
on an empty database and a real ``brooq supervise`` that runs a job enqueued with
``brooq enqueue``. Dependencies come from the package registry. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from brooq import __version__

pytestmark = [pytest.mark.system, pytest.mark.db]

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = ROOT / "brooq" / "postgres" / "migrations"
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".pgdata",
    "*.egg-info",
    "build",
    "dist",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    ".env",
)
_SCRUBBED_PREFIXES = ("QUEUE_", "BROOQ_", "LOG_", "WATCHDOG_")
_SCRUBBED = {
    "DATABASE_URL",
    "HTTP_ADDR",
    "CREDENTIALS_DIRECTORY",
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "NOTIFY_SOCKET",
}


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)
    }
    env.update(extra)
    return env


def run(
    *cmd: str | Path,
    cwd: Path,
    timeout: float,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist and wheel built from a copy of the checkout (the checkout is left untouched)."""
    base = tmp_path_factory.mktemp("packaging")
    source = base / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCE)
    out = base / "dist"
    # Without --sdist/--wheel, build makes the sdist and then the wheel *from the sdist*:
    # a file the sdist forgets is missing from the wheel too.
    run(sys.executable, "-m", "build", "--outdir", out, cwd=source, timeout=240)
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed (dependencies from the registry)."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    run(sys.executable, "-m", "venv", path, cwd=path.parent, timeout=120)
    wheel = next(dist.glob("brooq-*.whl"))
    run(
        path / "bin" / "pip",
        "install",
        "--disable-pip-version-check",
        "-q",
        wheel,
        cwd=path.parent,
        timeout=300,
    )
    return path


def shipped_sql() -> set[str]:
    return {p.name for p in MIGRATIONS.glob("*.sql")}


def test_the_wheel_carries_the_sql_and_the_version(dist: Path) -> None:
    wheel = next(dist.glob("brooq-*.whl"))
    assert wheel.name.startswith(f"brooq-{__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    migrations = {n.rsplit("/", 1)[1] for n in names if n.startswith("brooq/postgres/migrations/")}
    assert migrations == shipped_sql() and migrations
    assert "brooq/postgres/queries.sql" in names
    assert not any(n.startswith(("tests/", "migrations/")) for n in names)
    # The dashboard works offline: every template and asset is in the wheel.
    dashboard = ROOT / "brooq" / "surface" / "dashboard"
    for folder in ("templates", "static"):
        shipped = {p.name for p in (dashboard / folder).iterdir()}
        assert shipped and {f"brooq/surface/dashboard/{folder}/{n}" for n in shipped} <= names


def test_the_sdist_carries_everything_needed_to_build_test_and_deploy(dist: Path) -> None:
    sdist = next(dist.glob("brooq-*.tar.gz"))
    prefix = f"brooq-{__version__}/"
    with tarfile.open(sdist) as tar:
        names = {n.removeprefix(prefix) for n in tar.getnames()}
    for needed in (
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        ".env.example",
        "brooq/postgres/queries.sql",
        "systemd/brooq.service",
        "systemd/brooq-migrate.service",
        "docs/operations.md",
        "docs/architecture.md",
        "tests/conftest.py",
        "scripts/pg.sh",
        "monitoring/prometheus/brooq-alerts.yml",
    ):
        assert needed in names, needed
    assert {f"brooq/postgres/migrations/{n}" for n in shipped_sql()} <= names
    assert not any("__pycache__" in n for n in names)


@contextlib.contextmanager
def supervisor(venv: Path, app_dir: Path, dsn: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``brooq supervise`` from the venv, in its own session; always gone afterwards."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(venv / "bin" / "brooq"),
                "supervise",
                "--app",
                "tinyapp:queue",
                "--workers",
                "1",
                "--http-addr",
                "127.0.0.1:0",
                "--poll-interval",
                "200ms",
                "--graceful-timeout",
                "5s",
            ],
            cwd=app_dir,
            env=clean_env(DATABASE_URL=dsn),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def wait_state(dsn: str, job_id: str, state: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT state FROM job WHERE id = %s", (job_id,)).fetchone()
            if row and row[0] == state:
                return
            assert time.monotonic() < deadline, f"job {job_id} not {state} in {timeout}s: {row}"
            time.sleep(0.1)


@pytest.mark.timeout(240)
def test_the_installed_wheel_migrates_and_runs_a_job(
    venv: Path,
    empty_dsn: str,
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    where = run(
        venv / "bin" / "python",
        "-c",
        "import brooq; print(brooq.__file__)",
        cwd=outside,
        timeout=30,
    ).stdout.strip()
    assert where.startswith(str(venv)), f"brooq imported from {where}, not from the venv"
    brooq = venv / "bin" / "brooq"
    env = clean_env(DATABASE_URL=empty_dsn)

    run(brooq, "migrate", "up", cwd=outside, env=env, timeout=60)
    status = run(brooq, "migrate", "status", cwd=outside, env=env, timeout=60).stdout
    assert status.count("applied") == len(list(MIGRATIONS.glob("*.rollback.sql"))), status
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT to_regclass('job') IS NOT NULL").fetchone() == (True,)

    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "tinyapp.py").write_text(
        textwrap.dedent("""\
        import os
        import brooq

        queue = brooq.Queue(os.environ["DATABASE_URL"])

        @queue.kind("hello")
        def hello(claim: brooq.Claim) -> None:
            print("hello", claim.payload["name"], flush=True)
    """)
    )
    log = tmp_path / "supervisor.log"
    with supervisor(venv, app_dir, empty_dsn, log) as proc:
        enqueued = run(
            brooq,
            "enqueue",
            "--topic",
            "hello",
            "--payload",
            '{"name": "wheel"}',
            cwd=outside,
            env=env,
            timeout=60,
        ).stdout
        job_id = json.loads(enqueued)["id"]
        try:
            wait_state(empty_dsn, job_id, "done", timeout=30)
        except AssertionError:
            raise AssertionError(log.read_text(errors="replace")) from None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text(errors="replace")
    assert "hello wheel" in log.read_text()
