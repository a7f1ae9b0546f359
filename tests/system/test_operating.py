"""Operating a real supervisor: its registration (``brooq workers``), the dashboard it serves,
and a handler's print() that survives a redirected stdout."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.system.harness import Supervisor, insert_jobs, run_cli, states, wait_until

pytestmark = [pytest.mark.db, pytest.mark.system]


def workers_json(dsn: str, workdir: Path) -> list[dict[str, Any]]:
    done = run_cli(dsn, workdir, "workers", "--json")
    assert done.returncode == 0, done.stderr
    supervisors: list[dict[str, Any]] = json.loads(done.stdout)["supervisors"]
    return supervisors


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_a_supervisor_registers_shows_its_jobs_and_leaves_at_stop(
    supervise: Callable[..., Supervisor], dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    sup = supervise("--workers", "2")
    sup.wait_children(2)
    (job,) = insert_jobs(pg, "work", [{"sleep": 30}])

    def running_row() -> dict[str, Any] | None:
        rows = workers_json(dsn, tmp_path)
        if len(rows) == 1 and any(w["job_id"] == job for w in rows[0]["workers"]):
            return rows[0]
        return None

    row = wait_until(running_row, 20, "the supervisor's row to show the running job")
    assert row["pid"] == sup.pid and row["alive"] and len(row["workers"]) == 2
    assert "work" in row["topics"]
    busy = next(w for w in row["workers"] if w["job_id"] == job)
    assert busy["topic"] == "work" and busy["elapsed_s"] >= 0
    assert busy["pid"] in sup.children()
    text = run_cli(dsn, tmp_path, "workers").stdout
    assert row["holder"] in text and job in text
    status = json.loads(run_cli(dsn, tmp_path, "status", "--json").stdout)
    assert [s["holder"] for s in status["supervisors"]] == [row["holder"]]

    # The dashboard is served on the same surface, off the loop.
    addr = sup.env_used["HTTP_ADDR"]
    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as redirected:
        opener.open(f"http://{addr}/", timeout=5)
    assert redirected.value.code == 303 and redirected.value.headers["Location"] == "/ui"
    with urllib.request.urlopen(f"http://{addr}/ui", timeout=5) as page:
        html = page.read().decode()
    assert row["holder"] in html and "read-only" in html

    sup.send(signal.SIGQUIT)
    sup.wait_exit(30)
    assert workers_json(dsn, tmp_path) == []
    assert pg.execute("SELECT count(*) FROM brooq_supervisor").fetchone() == (0,)


def test_handler_prints_reach_a_redirected_stdout(
    supervise: Callable[..., Supervisor], pg: psycopg.Connection[Any]
) -> None:
    # Like `brooq supervise > out.txt`: stdout is a file (block-buffered, no
    # PYTHONUNBUFFERED), and workers recycle after 2 jobs through os._exit.
    sup = supervise(
        "--workers",
        "2",
        "--max-jobs-per-worker",
        "2",
        app="sysapp_print:queue",
        env={"PYTHONUNBUFFERED": ""},
    )
    sup.wait_children(2)
    insert_jobs(pg, "shout", [{"n": i} for i in range(9)])
    wait_until(lambda: states(pg) == {"done": 9}, 30, "every job done")
    sup.stop(timeout=30)
    log = sup.log_path.read_text()
    for i in range(9):
        assert f"printed-by-handler {i}\n" in log
        assert f"stderr-by-handler {i}\n" in log


def healthy(addr: str) -> bool:
    """True when /healthz answers 200 within 5 s."""
    try:
        with urllib.request.urlopen(f"http://{addr}/healthz", timeout=5) as health:
            return bool(health.status == 200)
    except urllib.error.HTTPError:
        return False


def test_a_busy_dashboard_does_not_hold_the_supervisor_up(
    supervise: Callable[..., Supervisor], pg: psycopg.Connection[Any]
) -> None:
    # Eight clients reload the overview and the job list without pause while the
    # workers recycle after every 2 jobs: the loop must keep forking, heartbeating
    # and settling, and /healthz must keep answering.
    sup = supervise("--workers", "2", "--max-jobs-per-worker", "2")
    sup.wait_children(2)
    addr = sup.env_used["HTTP_ADDR"]
    stop = threading.Event()
    pages = [0]

    def hammer() -> None:
        while not stop.is_set():
            for path in ("/ui", "/ui/jobs?state=done"):
                with (
                    contextlib.suppress(OSError),
                    urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as page,
                ):
                    page.read()
                    pages[0] += 1

    clients = [threading.Thread(target=hammer, daemon=True) for _ in range(8)]
    for client in clients:
        client.start()
    try:
        insert_jobs(pg, "work", [None] * 40)
        wait_until(lambda: states(pg) == {"done": 40}, 60, "40 jobs done under a busy dashboard")
        # A worker that just recycled makes /healthz say 503 until its successor boots
        # (milliseconds): the supervisor answers, and is whole again at once.
        wait_until(lambda: healthy(addr), 5, "/healthz 200 under a busy dashboard")
        # ...and the dashboard kept answering them (how many by now depends on the machine).
        wait_until(lambda: pages[0] > 20, 30, "more than 20 pages served")
    finally:
        stop.set()
        for client in clients:
            client.join(10)
    assert pages[0] > 20
    assert len(sup.events("WorkerStarted")) >= 20  # every worker recycled many times
    assert not sup.events("LeaseLost") and not sup.events("DatabaseStuck")
