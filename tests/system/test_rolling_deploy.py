"""A rolling deploy (issue 34): supervisors of v1 and v2 on one database, as real processes.

v2's jobs never start on v1; v1's jobs drain on v1; once v1 stopped, what the old code still
enqueued waits until `brooq jobs retarget` gives it to v2; nothing is lost or run twice. Each
job's result is the version of the supervisor that ran it (tests/system/apps/sysapp_versions).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job
from tests.system.harness import PYTHONPATH, count, run_cli, wait_until
from tests.system.obs_helpers import http_addr, scrape

pytestmark = [pytest.mark.system, pytest.mark.db]

ARGS = ("--workers", "2", "--http-addr", "127.0.0.1:0", "--poll-interval", "200ms",
        "--graceful-timeout", "5s")  # fmt: skip
APP = "sysapp_versions:queue"


def enqueue_as(dsn: str, version: str | None, n: int, sleep: float = 0.05) -> list[str]:
    """``n`` jobs enqueued by code of ``version`` (its Queue's store stamps them)."""
    store = PostgresStore(dsn, app_version=version)
    try:
        return [e.id for e in store.enqueue_many([Job("work", {"sleep": sleep})] * n)]
    finally:
        store.close()


def ran_on(pg: psycopg.Connection[Any], ids: list[str]) -> dict[str | None, int]:
    """How many of ``ids`` each version ran (its result), done ones only."""
    rows = pg.execute(
        "SELECT result #>> '{}', count(*) FROM job WHERE id = ANY(%s::uuid[]) AND state = 'done' "
        "GROUP BY 1",
        (ids,),
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


@pytest.mark.timeout(120)
def test_a_rolling_deploy_runs_each_job_on_its_own_version_once(
    dsn: str, pg: psycopg.Connection[Any], supervise: Any, tmp_path: Path
) -> None:
    v1 = supervise(*ARGS, app=APP, name="v1", env={"QUEUE_APP_VERSION": "v1"})
    v1.wait_children(2, timeout=30)
    old = enqueue_as(dsn, "v1", 40, sleep=0.05)
    v2 = supervise(*ARGS, app=APP, name="v2", env={"QUEUE_APP_VERSION": "v2"})
    v2.wait_children(2, timeout=30)
    new = enqueue_as(dsn, "v2", 40, sleep=0.02)
    plain = enqueue_as(dsn, None, 10, sleep=0.02)  # unversioned: any supervisor

    wait_until(lambda: ran_on(pg, new).get("v2") == 40, 40, "v2's jobs done on v2")
    wait_until(lambda: sum(ran_on(pg, old).values()) == 40, 40, "v1's jobs drained")
    assert ran_on(pg, old) == {"v1": 40}, "a v1 job ran elsewhere than on v1"
    assert ran_on(pg, new) == {"v2": 40}, "a v2 job started on v1"
    wait_until(lambda: sum(ran_on(pg, plain).values()) == 10, 20, "unversioned jobs done")
    assert set(ran_on(pg, plain)) <= {"v1", "v2"}

    rows = pg.execute("SELECT app_version FROM brooq_supervisor").fetchall()
    assert sorted(r[0] for r in rows) == ["v1", "v2"], rows
    out = run_cli(dsn, tmp_path, "workers", "--json")
    assert out.returncode == 0, out.stderr
    shown = {s["app_version"] for s in json.loads(out.stdout)["supervisors"]}
    assert shown == {"v1", "v2"}
    metrics = scrape(http_addr(v2))
    assert metrics.value("brooq_app_version_info", app_version="v2") == 1

    assert v1.stop() == 0  # the old version's supervisors are gone…
    late = enqueue_as(dsn, "v1", 15)  # …while old web processes still enqueue as v1
    time.sleep(1.5)  # v2 polls every 200 ms: it would have taken them by now
    assert count(pg, "id = ANY(%s::uuid[]) AND state = 'pending'", (late,)) == 15

    out = run_cli(dsn, tmp_path, "status")
    assert "NO LIVE SUPERVISOR of this version" in out.stdout, out.stdout
    out = run_cli(dsn, tmp_path, "jobs", "retarget", "--from-version", "v1", "--to-version", "v2")
    assert (out.returncode, out.stdout.strip()) == (0, "retargeted 15 jobs"), out.stderr
    wait_until(lambda: ran_on(pg, late).get("v2") == 15, 30, "retargeted jobs done on v2")

    everything = old + new + plain + late
    assert count(pg) == len(everything) == 105, "a job was lost or added"
    assert count(pg, "state = 'done'") == 105
    assert count(pg, "attempts <> 1") == 0, "a job ran twice"
    assert v2.stop() == 0


@pytest.mark.timeout(60)
def test_brooq_work_claims_as_its_version(
    dsn: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """``brooq work`` with QUEUE_APP_VERSION runs its version's jobs (and unversioned ones),
    never another version's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("QUEUE_", "BROOQ_", "LOG_")) and k != "DATABASE_URL"
    }
    env.update({"DATABASE_URL": dsn, "PYTHONPATH": PYTHONPATH, "QUEUE_APP_VERSION": "v2",
                "QUEUE_POLL_INTERVAL": "200ms"})  # fmt: skip
    old, new, plain = enqueue_as(dsn, "v1", 5), enqueue_as(dsn, "v2", 5), enqueue_as(dsn, None, 2)
    with open(tmp_path / "work.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "brooq.cli", "work", "--app", APP],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        try:
            wait_until(lambda: ran_on(pg, new + plain).get("v2") == 7, 30, "v2's jobs done")
            time.sleep(1.0)  # it polls every 200 ms: it would have taken v1's by now
            assert count(pg, "id = ANY(%s::uuid[]) AND state = 'pending'", (old,)) == 5
        finally:
            proc.terminate()
            proc.wait(timeout=20)
