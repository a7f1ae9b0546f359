"""App versions on the dashboard (issue 34): each supervisor's version, the jobs waiting
per version, and the retarget action (the token's holder only, after a confirmation)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote_plus

import psycopg
import pytest

from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job
from tests.dashboard_server import TOKEN, Served, serve_dashboard

BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def guarded(dsn: str) -> Iterator[Served]:
    with serve_dashboard(dsn, token=TOKEN) as served:
        yield served


def enqueue_as(dsn: str, version: str | None, n: int) -> list[str]:
    store = PostgresStore(dsn, app_version=version)
    try:
        return [e.id for e in store.enqueue_many([Job("work", {"i": i}) for i in range(n)])]
    finally:
        store.close()


def versions_of(pg: psycopg.Connection[Any], ids: list[str]) -> set[str | None]:
    rows = pg.execute("SELECT app_version FROM job WHERE id = ANY(%s::uuid[])", (ids,))
    return {r[0] for r in rows}


def test_the_overview_shows_versions_and_retarget_moves_jobs(
    guarded: Served, dsn: str, pg: psycopg.Connection[Any]
) -> None:
    old = enqueue_as(dsn, "v1", 3)
    enqueue_as(dsn, "v2", 1)
    pg.execute(
        "INSERT INTO brooq_supervisor (holder, host, pid, app, topics, app_version) "
        "VALUES ('host-a:1:x', 'host-a', 1, 'app:queue', '{work}', 'v2')"
    )
    page = guarded.request("GET", "/ui", None, BEARER)
    assert page.status == 200
    assert 'id="versions"' in page.body and 'data-version="v1"' in page.body
    assert "no supervisor" in page.body  # v1 has jobs and no live supervisor
    assert 'title="app version">v2<' in page.body

    asked = guarded.request(
        "POST", "/ui/versions/retarget", {"from_version": "v1", "to_version": "v2"}, BEARER
    )
    assert asked.status == 200 and "Move 3 jobs not started yet from v1 to v2" in asked.body
    assert versions_of(pg, old) == {"v1"}
    done = guarded.request(
        "POST",
        "/ui/versions/retarget",
        {"from_version": "v1", "to_version": "v2", "confirm": "yes"},
        BEARER,
    )
    assert done.status == 303
    assert "retargeted 3 jobs from v1 to v2" in unquote_plus(done.headers["Location"])
    assert versions_of(pg, old) == {"v2"}


def test_retarget_refuses_bad_versions_and_needs_the_token(
    guarded: Served, dsn: str, pg: psycopg.Connection[Any]
) -> None:
    old = enqueue_as(dsn, "v1", 1)
    bad = guarded.request(
        "POST", "/ui/versions/retarget", {"from_version": "v1", "to_version": "v 2"}, BEARER
    )
    assert bad.status == 400 and "app version" in bad.body
    same = guarded.request(
        "POST", "/ui/versions/retarget", {"from_version": "v1", "to_version": "v1"}, BEARER
    )
    assert same.status == 400
    anonymous = guarded.request(
        "POST",
        "/ui/versions/retarget",
        {"from_version": "v1", "to_version": "v2", "confirm": "yes"},
    )
    assert anonymous.status in (401, 403)
    assert versions_of(pg, old) == {"v1"}


def test_without_versions_the_overview_has_no_version_section(guarded: Served, dsn: str) -> None:
    enqueue_as(dsn, None, 2)
    page = guarded.request("GET", "/ui", None, BEARER)
    assert page.status == 200 and 'id="versions"' not in page.body
