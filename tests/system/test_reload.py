"""SIGHUP puts new code into service: real supervisor, app file rewritten on disk, real signals.

v1 serves; the file becomes v2, SIGHUP: jobs are then handled by v2 code, a
job running across the reload finishes on its old worker, nothing is lost or
run twice. Then a broken v3, SIGHUP: one ReloadFailed error, the same
workers keep serving v2. Every wait is bounded.
"""

from __future__ import annotations

import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import Supervisor, all_terminal, count, insert_jobs, wait_until
from tests.system.test_systemd_notify import NotifySocket, notify_socket  # noqa: F401

pytestmark = [pytest.mark.system, pytest.mark.db]

APP = """
import os
import time

import brooq

VERSION = "{version}"
queue = brooq.Queue(os.environ["DATABASE_URL"])


@queue.kind("work")
def work(claim: brooq.Claim) -> None:
    time.sleep(float((claim.payload or {{}}).get("sleep", 0.02)))

    def record(conn) -> None:
        conn.execute("INSERT INTO seen (job_id, version) VALUES (%s, %s)", (claim.id, VERSION))

    claim.on_succeeded(record)
{extra}
"""


def write_app(directory: Path, version: str, extra: str = "") -> None:
    """Rewrite the app module; the padding makes every version's size differ (pyc check)."""
    text = APP.format(version=version, extra=extra) + "#" * (10 * len(version + extra)) + "\n"
    (directory / "reloadapp.py").write_text(text)


def versions(pg: psycopg.Connection[Any]) -> dict[str, int]:
    return {v: n for v, n in pg.execute("SELECT version, count(*) FROM seen GROUP BY version")}


@pytest.mark.timeout(90)
def test_sighup_loads_new_code_and_keeps_old_on_broken_import(
    pg: psycopg.Connection[Any],
    supervise: Any,
    tmp_path: Path,
    notify_socket: NotifySocket,  # noqa: F811
) -> None:
    pg.execute("CREATE TABLE seen (job_id uuid NOT NULL UNIQUE, version text NOT NULL)")
    write_app(tmp_path, "v1")
    sup = supervise(
        "--workers",
        "2",
        "--poll-interval",
        "200ms",
        "--graceful-timeout",
        "10s",
        app="reloadapp:queue",
        env={"PYTHONDONTWRITEBYTECODE": "1", "NOTIFY_SOCKET": str(notify_socket.path)},
    )
    v1_workers = sup.wait_children(2)
    notify_socket.wait_for("READY", 10)
    ids = insert_jobs(pg, "work", [{} for _ in range(20)])
    wait_until(lambda: versions(pg).get("v1", 0) >= 20, 20, "v1 handles the first jobs")

    # v2 on disk; a long job is running on a v1 worker when the HUP arrives.
    long_id = insert_jobs(pg, "work", [{"sleep": 2.0}])[0]
    wait_until(lambda: sup.child_running(long_id), 10, "the long job to start")
    write_app(tmp_path, "v2")
    started = time.monotonic()
    sup.send(signal.SIGHUP)
    ids += insert_jobs(pg, "work", [{} for _ in range(20)])
    sup.wait_event("SupervisorReloaded", 30)
    v2_workers = sup.wait_children(2, timeout=30, exclude=v1_workers)
    # systemd sees RELOADING=1, then READY=1 once every worker runs the new code.
    assert "MONOTONIC_USEC" in notify_socket.wait_for("RELOADING", 10).fields
    ready = notify_socket.wait_for("READY", 30, sup)
    assert sorted(ready.workers) == sorted(v2_workers)
    ids += insert_jobs(pg, "work", [{} for _ in range(30)])
    wait_until(lambda: versions(pg).get("v2", 0) >= 30, 30, "v2 handles jobs")
    reload_s = time.monotonic() - started

    # v3 fails at import: one error, the v2 workers serve on.
    write_app(tmp_path, "v3", extra="raise RuntimeError('v3 is broken')")
    sup.send(signal.SIGHUP)
    failed = sup.wait_event("ReloadFailed", 30)
    assert "v3 is broken" in failed["error"]
    notify_socket.wait_for("RELOADING", 10)
    assert "reload failed" in notify_socket.wait_for("READY", 10).fields["STATUS"]
    before = versions(pg).get("v2", 0)
    ids += insert_jobs(pg, "work", [{} for _ in range(20)])
    wait_until(lambda: versions(pg).get("v2", 0) >= before + 20, 20, "v2 keeps serving")
    assert sup.children() == v2_workers
    assert "v3" not in versions(pg)

    ids.append(long_id)
    wait_until(lambda: all_terminal(pg), 20, "every job terminal")
    assert count(pg, "state <> 'done'") == 0
    assert count(pg, "attempts <> 1") == 0, "a job ran twice"
    seen = pg.execute("SELECT count(*), count(DISTINCT job_id) FROM seen").fetchone()
    assert seen == (len(ids), len(ids)), "each job's effect exactly once"
    long_version = pg.execute("SELECT version FROM seen WHERE job_id = %s", (long_id,)).fetchone()
    assert long_version == ("v1",), "the running job finished on its old worker"
    assert len(sup.events("ReloadFailed")) == 1
    assert not sup.events("WorkerKilled")
    assert reload_s < 30


@pytest.mark.timeout(60)
def test_sighup_applies_new_settings_from_the_env_file(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """QUEUE_WORKERS from .env: 2, then 3 on SIGHUP; a changed lease is named, not applied."""
    pg.execute("CREATE TABLE seen (job_id uuid NOT NULL UNIQUE, version text NOT NULL)")
    write_app(tmp_path, "v1")
    env_file = tmp_path / ".env"
    env_file.write_text("QUEUE_WORKERS=2\nQUEUE_LEASE=2m\nQUEUE_POLL_INTERVAL=200ms\n")
    sup = supervise(app="reloadapp:queue", env={"PYTHONDONTWRITEBYTECODE": "1"})
    two = sup.wait_children(2)
    env_file.write_text("QUEUE_WORKERS=3\nQUEUE_LEASE=5m\nQUEUE_POLL_INTERVAL=200ms\n")
    sup.send(signal.SIGHUP)
    reloaded = sup.wait_event("SupervisorReloaded", 30)
    assert reloaded["workers"] == 3
    assert reloaded["needs_restart"] == "lease,reaper_period"  # the period follows the lease
    three = sup.wait_children(3, timeout=30, exclude=two)
    ids = insert_jobs(pg, "work", [{} for _ in range(30)])
    wait_until(lambda: count(pg, "state = 'done'") == len(ids), 20, "the jobs done")
    assert sorted(sup.children()) == sorted(three)


MORE_KIND = """

@queue.kind("more")
def more(claim: brooq.Claim) -> None:
    pass
"""


@pytest.mark.timeout(60)
def test_a_topic_added_by_a_reload_has_every_metric(
    pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    """v2 adds topic ``more``: the first scrape after the reload has every series for it."""
    pg.execute("CREATE TABLE seen (job_id uuid NOT NULL UNIQUE, version text NOT NULL)")
    write_app(tmp_path, "v1")
    sup = supervise(
        "--workers",
        "1",
        "--poll-interval",
        "200ms",
        app="reloadapp:queue",
        env={"PYTHONDONTWRITEBYTECODE": "1"},
    )
    sup.wait_event("SupervisorReady", 30)
    url = f"http://{sup.env_used['HTTP_ADDR']}/metrics"
    assert 'topic="more"' not in scrape(url)
    write_app(tmp_path, "v2", extra=MORE_KIND)
    sup.send(signal.SIGHUP)
    sup.wait_event("SupervisorReloaded", 30)
    text = scrape(url)
    for series in (
        'brooq_jobs{state="pending",topic="more"}',
        'brooq_ready_oldest_age_seconds{topic="more"}',
        'brooq_worker_busy{topic="more"}',
        'brooq_claimed_total{topic="more"}',
    ):
        assert series in text, series
    assert sup.stop() == 0


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


LAUNCHER = """
import sys

from brooq.cli import main

sys.exit(main())
"""


class LaunchedSupervisor(Supervisor):
    """A supervisor started by a script of the project (``python bin/run.py supervise``),
    as a project's own entry point starts it: the script's folder is its sys.path[0]."""

    def __init__(self, launcher: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.launcher = launcher

    def command(self) -> list[str]:
        return [sys.executable, str(self.launcher), "supervise", "--app", self.app, *self.args]


@pytest.mark.timeout(60)
def test_a_reload_finds_the_app_where_the_first_import_found_it(
    pg: psycopg.Connection[Any], dsn: str, tmp_path: Path
) -> None:
    """Issue 32, item 15: the app lives beside the script that starts the supervisor, found
    through the script's folder on sys.path. The reload's check (``python -m`` in the
    working directory) had no such folder: "no module named 'reloadapp'", the old code
    served on."""
    pg.execute("CREATE TABLE seen (job_id uuid NOT NULL UNIQUE, version text NOT NULL)")
    bin_dir, work_dir = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    work_dir.mkdir()
    (bin_dir / "run.py").write_text(LAUNCHER)
    write_app(bin_dir, "v1")
    sup = LaunchedSupervisor(
        bin_dir / "run.py",
        dsn,
        work_dir,
        app="reloadapp:queue",
        args=("--workers", "1", "--poll-interval", "200ms", "--graceful-timeout", "3s"),
        env={"PYTHONDONTWRITEBYTECODE": "1"},
    )
    sup.start()
    try:
        v1 = sup.wait_children(1)
        insert_jobs(pg, "work", [{}])
        wait_until(lambda: versions(pg).get("v1", 0) == 1, 20, "v1 handles a job")
        write_app(bin_dir, "v2")
        sup.send(signal.SIGHUP)
        wait_until(
            lambda: sup.events("SupervisorReloaded") or sup.events("ReloadFailed"),
            30,
            "the reload to end",
        )
        assert not sup.events("ReloadFailed"), sup.events("ReloadFailed")
        sup.wait_children(1, timeout=30, exclude=v1)
        insert_jobs(pg, "work", [{}, {}])
        wait_until(lambda: versions(pg).get("v2", 0) == 2, 20, "v2 handles the next jobs")
        assert sup.stop() == 0
    finally:
        sup.stop(timeout=30)
