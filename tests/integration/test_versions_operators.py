"""App versions for operators (issue 34): `brooq jobs retarget`, and each supervisor's version
and the jobs waiting per version in `brooq workers` and `brooq status`, and in /metrics."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from brooq.metrics import DatabaseCollector
from brooq.postgres.inspection import PostgresInspection
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job
from tests.integration.test_job_commands import Run, brooq  # noqa: F401 (a fixture)

pytestmark = pytest.mark.db


def enqueue_as(dsn: str, version: str | None, n: int, topic: str = "work") -> list[str]:
    store = PostgresStore(dsn, app_version=version)
    try:
        return [e.id for e in store.enqueue_many([Job(topic, {"i": i}) for i in range(n)])]
    finally:
        store.close()


def versions(pg: psycopg.Connection[Any], ids: list[str]) -> list[str | None]:
    rows = pg.execute(
        "SELECT app_version FROM job WHERE id = ANY(%s::uuid[]) ORDER BY id", (ids,)
    ).fetchall()
    return [r[0] for r in rows]


def test_retarget_moves_the_jobs_not_started_yet_of_one_version(
    brooq: Run,  # noqa: F811
    dsn: str,
    pg: psycopg.Connection[Any],
) -> None:
    old = enqueue_as(dsn, "v1", 5)
    other = enqueue_as(dsn, "v1", 2, topic="other")
    new = enqueue_as(dsn, "v2", 1)
    pg.execute("UPDATE job SET state = 'done' WHERE id = %s", (old[0],))  # ended: stays v1

    code, out, _ = brooq("jobs", "retarget", "--from-version", "v1", "--to-version", "v2",
                         "--topic", "work", "--dry-run")  # fmt: skip
    assert (code, out.strip()) == (0, "would have retargeted 4 jobs (dry run: nothing changed)")
    assert set(versions(pg, old)) == {"v1"}

    code, out, err = brooq(
        "jobs", "retarget", "--from-version", "v1", "--to-version", "v2", "--topic", "work"
    )
    assert (code, out.strip(), err) == (0, "retargeted 4 jobs", "")
    assert pg.execute("SELECT app_version FROM job WHERE id = %s", (old[0],)).fetchone() == ("v1",)
    assert set(versions(pg, old[1:])) == {"v2"}
    assert set(versions(pg, other)) == {"v1"}  # the filter held
    assert versions(pg, new) == ["v2"]

    code, out, _ = brooq("jobs", "retarget", "--from-version", "v1", "--to-unversioned", "--json")
    assert code == 0 and json.loads(out)["retargeted"] == 2
    assert versions(pg, other) == [None, None]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--from-version", "v 1", "--to-version", "v2"], "--from-version: app version 'v 1'"),
        (["--from-version", "", "--to-version", "v2"], "--from-version given empty"),
        (["--from-version", "v2", "--to-version", "v2"], "name the same version"),
        (["--to-version", "v2"], "one of the arguments --from-version --from-unversioned"),
    ],
)
def test_retarget_refuses_bad_versions_and_names_them(
    brooq: Run,  # noqa: F811
    args: list[str],
    said: str,
) -> None:
    code, _, err = brooq("jobs", "retarget", *args)
    assert code == 2 and said in err


def test_workers_and_status_show_versions_and_what_waits_for_each(
    brooq: Run,  # noqa: F811
    dsn: str,
    pg: psycopg.Connection[Any],
) -> None:
    enqueue_as(dsn, "v1", 3)
    enqueue_as(dsn, "v2", 2)
    enqueue_as(dsn, None, 1)
    pg.execute(
        "INSERT INTO brooq_supervisor (holder, host, pid, app, topics, app_version) "
        "VALUES ('host-a:1:x', 'host-a', 1, 'app:queue', '{work}', 'v2')"
    )
    code, out, _ = brooq("workers")
    assert code == 0
    assert "version v2" in out
    assert "(unversioned)" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  v")}
    assert "NO LIVE SUPERVISOR" in lines["v1"] and " 3 " in lines["v1"]
    assert "1 live supervisor" in lines["v2"]
    code, out, _ = brooq("workers", "--json")
    doc = json.loads(out)
    assert doc["supervisors"][0]["app_version"] == "v2"
    assert {(r["app_version"], r["jobs"]) for r in doc["waiting_by_version"]} == {
        (None, 1),
        ("v1", 3),
        ("v2", 2),
    }
    code, out, _ = brooq("status")
    assert code == 0 and "jobs not started yet, by app version:" in out
    assert "NO LIVE SUPERVISOR of this version" in out


def test_metrics_count_the_jobs_waiting_per_version(dsn: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    enqueue_as(dsn, "v1", 3)
    enqueue_as(dsn, None, 1)
    inspection = PostgresInspection(dsn)
    try:
        registry = CollectorRegistry()
        registry.register(DatabaseCollector(inspection, ["work"]))
        text = generate_latest(registry).decode()
    finally:
        inspection.close()
    assert 'brooq_jobs_waiting_by_version{app_version="v1",topic="work"} 3.0' in text
    assert 'brooq_jobs_waiting_by_version{app_version="",topic="work"} 1.0' in text
