"""Issue 22, item 11: rows of ``brooq_supervisor`` that no supervisor wrote (an infinite
``seen_at``, ``workers`` that are not workers, a row dated a year ahead) make no view
fail: each view skips and names what it cannot read, and a row counts as live only while
its ``seen_at`` is recent by the database's clock, a row dated ahead included."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brooq.postgres.inspection import PostgresInspection
from brooq.postgres.sql import sql
from tests.dashboard_server import serve_dashboard
from tests.system.harness import insert_jobs, run_cli

pytestmark = pytest.mark.db

ODD = {
    "h:1:infinite": ("'infinity'", "'[]'", "'{email}'", "seen_at is infinity"),
    "h:2:object": (
        "now()",
        """'{"not": "a list"}'""",
        "'{email}'",
        "workers is not a list of workers",
    ),
    "h:3:numbers": ("now()", "'[1, 2]'", "'{email}'", "workers is not a list of workers"),
    "h:4:no-pid": ("now()", """'[{"slot": 0}]'""", "'{email}'", "workers is not a list of workers"),
    "h:5:null-topic": ("now()", "'[]'", "ARRAY[NULL]::text[]", "topics holds a null"),
}


@pytest.fixture
def odd_rows(pg: psycopg.Connection[Any]) -> None:
    for holder, (seen_at, workers, topics, _) in ODD.items():
        pg.execute(
            "INSERT INTO brooq_supervisor (holder, host, pid, topics, seen_at, workers) "
            f"VALUES (%s, 'h', 1, {topics}, {seen_at}, {workers}::jsonb)",
            (holder,),
        )
    pg.execute(
        "INSERT INTO brooq_supervisor (holder, host, pid, topics, seen_at) "
        "VALUES ('h:6:future', 'h', 6, '{email}', now() + interval '1 year')"
    )
    insert_jobs(pg, "email", [{"n": 1}])


def test_the_inspection_skips_and_names_odd_rows(odd_rows: None, dsn: str) -> None:
    inspection = PostgresInspection(dsn)
    try:
        found = inspection.supervisor_rows()
        assert inspection.supervisors() == found.rows
    finally:
        inspection.close()
    assert {s.holder: s.problem for s in found.skipped} == {
        holder: problem for holder, (_, _, _, problem) in ODD.items()
    }
    (future,) = found.rows
    assert future.holder == "h:6:future" and not future.alive


def test_workers_status_and_the_dashboard_name_what_they_skip(
    odd_rows: None, dsn: str, tmp_path: Path
) -> None:
    workers = run_cli(dsn, tmp_path, "workers")
    assert workers.returncode == 0, workers.stderr
    assert "no live supervisor" in workers.stdout
    for holder in ODD:
        assert f"holder {holder}: " in workers.stderr
    as_json = run_cli(dsn, tmp_path, "workers", "--json")
    assert as_json.returncode == 0 and len(json.loads(as_json.stdout)["skipped"]) == len(ODD)
    assert (
        len(json.loads(run_cli(dsn, tmp_path, "workers", "--all", "--json").stdout)["supervisors"])
        == 1
    )  # the row dated ahead: there, and not alive
    status = run_cli(dsn, tmp_path, "status")
    assert status.returncode == 0, status.stderr
    assert "NO LIVE WORKER serves these topics with ready jobs: email" in status.stdout
    assert "holder h:1:infinite: seen_at is infinity" in status.stdout
    status_json = json.loads(run_cli(dsn, tmp_path, "status", "--json").stdout)
    assert status_json["unserved_topics"] == ["email"]
    assert len(status_json["skipped_supervisors"]) == len(ODD)
    with serve_dashboard(dsn, None) as served:
        overview = served.request("GET", "/ui")
    assert overview.status == 200
    assert 'id="no-workers"' in overview.body and "Skipped 5 rows" in overview.body


def test_the_rows_no_supervisor_wrote_expire(odd_rows: None, pg: psycopg.Connection[Any]) -> None:
    pg.execute(
        "INSERT INTO brooq_supervisor (holder, host, pid, seen_at) "
        "VALUES ('h:7:now', 'h', 7, now())"
    )
    pg.execute(sql("expire_supervisors"), {"expire_after": timedelta(minutes=5)})
    left = {r[0] for r in pg.execute("SELECT holder FROM brooq_supervisor")}
    assert "h:1:infinite" not in left and "h:6:future" not in left and "h:7:now" in left
