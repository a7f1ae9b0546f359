"""Jobs without an idempotency key take the keyless statements: they write the job as
given, NOTIFY as the keyed ones do, and never read job (a statement that reads the
partitioned table would lock every partition of it, each time it runs)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from brooq.postgres.enqueue import PreparedBatch, control_params
from brooq.postgres.sql import statements
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import Job, State
from tests.integration.plans import Layout, explain

pytestmark = pytest.mark.db


def _row(pg: psycopg.Connection[Any], job_id: str) -> tuple[Any, ...]:
    row = pg.execute(
        "SELECT topic, payload, priority, available_at, rate_key, idempotency_key, state "
        "FROM job WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None, f"job {job_id} was not written"
    return tuple(row)


def test_a_keyless_job_is_written_as_given(
    pg: psycopg.Connection[Any], pg_store: PostgresStore
) -> None:
    later = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    (one,) = pg_store.enqueue_many(
        [Job("mail.send", {"to": "a@b.c"}, priority=3, available_at=later, rate_key="t1")]
    )
    assert (one.created, one.state) == (True, State.PENDING)
    assert isinstance(one.id, str)
    assert _row(pg, one.id) == ("mail.send", {"to": "a@b.c"}, 3, later, "t1", None, "pending")
    many = pg_store.enqueue_many([Job("mail.send", {"i": i}) for i in range(3)])
    assert [e.created for e in many] == [True] * 3
    assert len({e.id for e in many}) == 3
    for i, e in enumerate(many):
        topic, payload, priority, at, rate_key, key, state = _row(pg, e.id)
        assert (topic, payload, priority, rate_key, key, state) == (
            "mail.send",
            {"i": i},
            0,
            None,
            None,
            "pending",
        )
        assert abs(at - datetime.now(UTC)) < timedelta(minutes=1)


def test_a_batch_with_one_key_takes_the_keyed_statement(pg_store: PostgresStore) -> None:
    (first,) = pg_store.enqueue_many([Job("work", idempotency_key="k")])
    mixed = pg_store.enqueue_many([Job("work"), Job("work", idempotency_key="k")])
    assert mixed[0].created and not mixed[1].created
    assert mixed[1].id == first.id


def test_keyless_statements_are_chosen_only_without_keys() -> None:
    keyless = PreparedBatch([Job("a"), Job("b")], 1 << 20)
    assert keyless.statement([0], True)[0] == statements()["enqueue_one_keyless"]
    assert keyless.statement([0, 1], True)[0] == statements()["enqueue_many_keyless"]
    keyed = PreparedBatch([Job("a"), Job("b", idempotency_key="k")], 1 << 20)
    assert keyed.statement([0, 1], True)[0] == statements()["enqueue_many"]
    assert keyed.statement([1], True)[0] == statements()["enqueue_one"]
    assert keyed.statement([0], True)[0] == statements()["enqueue_one_keyless"]


@pytest.mark.parametrize("notify", [True, False])
def test_keyless_enqueue_notifies_as_asked(dsn: str, notify: bool) -> None:
    store = PostgresStore(dsn, notify=notify)
    try:
        with psycopg.connect(dsn, autocommit=True) as listener:
            listener.execute("LISTEN brooq_job")
            store.enqueue_many([Job("t.one")])
            store.enqueue_many([Job("t.many"), Job("t.many")])
            got = [n.payload for n in listener.notifies(timeout=0.5, stop_after=3)]
    finally:
        store.close()
    assert sorted(got) == (["t.many", "t.one"] if notify else [])


@pytest.mark.parametrize("name", ["enqueue_one_keyless", "enqueue_many_keyless"])
def test_keyless_statements_read_no_partition_of_job(
    pg: psycopg.Connection[Any], name: str
) -> None:
    params: dict[str, Any] = {
        "id": "01a00000-0000-7000-8000-000000000001",
        "topic": "t",
        "payload": "{}",
        "available_at": None,
        "priority": 0,
        "rate_key": None,
        **control_params(Job("t")),
        "notify": False,
        "app_version": None,
        "jobs": json.dumps([{"id": "01a00000-0000-7000-8000-000000000002", "topic": "t"}]),
    }
    with pg.transaction(force_rollback=True):
        plan = explain(pg, statements()[name], params)
    read = Layout(pg).relations(plan)
    assert read == set(), f"{name} reads {read}"
