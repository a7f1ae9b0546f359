"""The supervisor's registration service (``run_once(now)``) on a real database: its row, its
workers, rows of dead supervisors expiring, the delete at a clean stop."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from brooq.postgres.registration import PostgresRegistration
from brooq.postgres.store import PostgresStore
from brooq.supervisor.database import InlineDatabase
from brooq.supervisor.registration import EXPIRE_AFTER, PERIOD, Registration

pytestmark = pytest.mark.db


class Workers:
    """What the loop hands Registration each tick: its workers, topics, whether it stops."""

    def __init__(self) -> None:
        claimed = SimpleNamespace(id="0190f4c4-7a55-7c1e-8f00-000000000001", topic="email.send")
        busy = SimpleNamespace(pid=101, slot=0, job=SimpleNamespace(claimed=claimed, started=0.0))
        idle = SimpleNamespace(pid=102, slot=1, job=None)
        self.children: list[Any] = [busy, idle]
        self.topics = ["report", "email.send"]
        self.stopping = False

    def tick(self, registration: Registration, now: float) -> str | None:
        return registration.run_once(
            now, workers=self.children, topics=self.topics, stopping=self.stopping
        )


def registration_on(store: PostgresStore) -> tuple[Registration, InlineDatabase]:
    writes = InlineDatabase()
    writer = PostgresRegistration(store.connector)
    return Registration(writer, writes, holder="host-a:77:abc", app="app:queue"), writes


def rows(pg: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    cur = pg.cursor(row_factory=psycopg.rows.dict_row)
    return {r["holder"]: r for r in cur.execute("SELECT * FROM brooq_supervisor")}


def test_run_once_registers_when_due_and_expires_dead_supervisors(
    pg_store: PostgresStore, pg: psycopg.Connection[Any]
) -> None:
    expired = EXPIRE_AFTER.total_seconds() + 5
    pg.execute(
        "INSERT INTO brooq_supervisor (holder, host, pid, seen_at) "
        "VALUES ('gone:1:x', 'gone', 1, now() - %s * interval '1 second')",
        (expired,),
    )
    registration, writes = registration_on(pg_store)
    loop = Workers()
    loop.tick(registration, 1000.0)
    found = rows(pg)
    assert set(found) == {"host-a:77:abc"}  # the long-dead one expired
    mine = found["host-a:77:abc"]
    assert mine["topics"] == ["email.send", "report"] and mine["app"] == "app:queue"
    workers = mine["workers"] if isinstance(mine["workers"], list) else json.loads(mine["workers"])
    assert [(w["pid"], w["job_id"], w["topic"]) for w in workers] == [
        (101, "0190f4c4-7a55-7c1e-8f00-000000000001", "email.send"),
        (102, None, None),
    ]
    assert workers[0]["started_at"] is not None
    assert writes.ran == ["register"]
    loop.tick(registration, 1000.0 + PERIOD.total_seconds() / 2)  # not due yet
    assert writes.ran == ["register"]
    loop.tick(registration, 1000.0 + PERIOD.total_seconds() + 0.1)
    assert writes.ran == ["register", "register"]


def test_a_clean_stop_deletes_the_row_once_no_worker_is_left(
    pg_store: PostgresStore, pg: psycopg.Connection[Any]
) -> None:
    registration, writes = registration_on(pg_store)
    loop = Workers()
    loop.tick(registration, 1.0)
    loop.stopping = True
    loop.tick(registration, 100.0)  # workers still finishing: the row stays, kept current
    assert "host-a:77:abc" in rows(pg)
    loop.children = []
    loop.tick(registration, 101.0)
    loop.tick(registration, 102.0)
    assert rows(pg) == {}
    assert writes.ran.count("unregister") == 1


def test_an_unmigrated_table_warns_once_and_jobs_go_on(
    pg_store: PostgresStore, pg: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    pg.execute("DROP TABLE brooq_supervisor")
    registration, _ = registration_on(pg_store)
    loop = Workers()
    loop.tick(registration, 1.0)
    loop.tick(registration, 100.0)
    warned = [
        r
        for r in caplog.records
        if "RegistrationFailed" in r.getMessage() or getattr(r, "event", "") == "RegistrationFailed"
    ]
    assert len(warned) == 1
