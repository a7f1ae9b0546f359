"""brooq inside a SQLAlchemy 2 transaction (psycopg 3 driver): the job shares the Session's fate."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import brooq
from brooq.integrations import NotPsycopg3, sqlalchemy_connection
from brooq.postgres.store import PostgresStore
from tests.integration.schema import has_job_table, migration_names, schema_of, sql_of

pytestmark = pytest.mark.db

LEASE = timedelta(minutes=1)


def sqlalchemy_url(dsn: str) -> URL:
    """A ``postgresql+psycopg`` URL for a libpq DSN (URL or key=value form)."""
    params = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items()}
    return URL.create(
        "postgresql+psycopg",
        username=params.pop("user", None),
        password=params.pop("password", None),
        host=params.pop("host", None),
        port=int(params.pop("port")) if "port" in params else None,
        database=params.pop("dbname", None),
        query=params,
    )


@pytest.fixture
def engine(dsn: str, pg: psycopg.Connection[Any]) -> Iterator[Engine]:
    pg.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    engine = create_engine(sqlalchemy_url(dsn))
    yield engine
    engine.dispose()


@pytest.fixture
def queue(dsn: str) -> Iterator[brooq.Queue]:
    queue = brooq.Queue(dsn)
    yield queue
    queue.close()


def jobs(pg: psycopg.Connection[Any]) -> list[tuple[str, str, str | None]]:
    return [
        (str(i), t, k)
        for i, t, k in pg.execute("SELECT id, topic, idempotency_key FROM job ORDER BY id")
    ]


class Boom(Exception):
    pass


def test_rollback_leaves_neither_the_row_nor_the_job(
    engine: Engine,
    queue: brooq.Queue,
    pg: psycopg.Connection[Any],
) -> None:
    with pytest.raises(Boom), Session(engine) as s, s.begin():
        s.execute(text("INSERT INTO orders (id) VALUES (1)"))
        # The documented spelling, without the helper.
        _, created = queue.enqueue(
            brooq.Job(topic="email.send", payload={"order": 1}, idempotency_key="order-1"),
            conn=s.connection().connection.driver_connection,
        )
        assert created
        raise Boom
    assert jobs(pg) == []
    assert pg.execute("SELECT count(*) FROM orders").fetchone() == (0,)


def test_commit_makes_the_job_claimable(
    engine: Engine,
    queue: brooq.Queue,
    dsn: str,
    pg: psycopg.Connection[Any],
) -> None:
    with Session(engine) as s, s.begin():
        s.execute(text("INSERT INTO orders (id) VALUES (1)"))
        job_id, created = queue.enqueue(
            brooq.Job(topic="email.send", payload={"order": 1}, idempotency_key="order-1"),
            conn=sqlalchemy_connection(s),
        )
        assert created
        # Not visible to anyone else before the commit.
        assert jobs(pg) == []
    assert jobs(pg) == [(job_id, "email.send", "order-1")]
    store = PostgresStore(dsn)
    try:
        claimed = store.claim("test:1", ["email.send"], LEASE)
        assert claimed is not None
        assert claimed.ticket.job_id == job_id
        assert claimed.payload == {"order": 1}
    finally:
        store.close()


def test_many_jobs_and_a_duplicate_key_in_one_session(
    engine: Engine,
    queue: brooq.Queue,
    pg: psycopg.Connection[Any],
) -> None:
    with Session(engine) as s, s.begin():
        conn = sqlalchemy_connection(s)
        first = queue.enqueue_many(
            [
                brooq.Job(topic="email.send", payload={"n": 1}, idempotency_key="k"),
                brooq.Job(topic="email.send", payload={"n": 2}),
            ],
            conn=conn,
        )
        again = queue.enqueue(brooq.Job(topic="email.send", idempotency_key="k"), conn=conn)
    assert [e.created for e in first] == [True, True]
    assert again == (first[0].id, False)
    assert len(jobs(pg)) == 2


def test_a_connection_works_like_a_session(
    engine: Engine,
    queue: brooq.Queue,
    pg: psycopg.Connection[Any],
) -> None:
    with engine.begin() as connection:
        queue.enqueue(brooq.Job(topic="email.send"), conn=sqlalchemy_connection(connection))
    assert len(jobs(pg)) == 1


def test_another_driver_is_refused_with_a_clear_error() -> None:
    engine = create_engine("sqlite://")
    try:
        with engine.connect() as connection, pytest.raises(NotPsycopg3, match=r"\+psycopg://"):
            sqlalchemy_connection(connection)
    finally:
        engine.dispose()


def test_something_else_is_refused() -> None:
    with pytest.raises(TypeError, match="Session or Connection"):
        sqlalchemy_connection(object())


# -- the schema from Alembic: op.execute(<file>) is connection.execute(text(<file>)) ----------


def test_the_migration_files_through_sqlalchemy_text_build_the_same_schema(
    empty_dsn: str,
    dsn: str,
) -> None:
    """What docs/integrations.md tells Alembic users to do: each file in order, then back."""
    engine = create_engine(sqlalchemy_url(empty_dsn))
    try:
        for name in migration_names():
            with engine.begin() as connection:  # Alembic runs a migration in a transaction
                connection.execute(text(sql_of(name)))
        assert schema_of(empty_dsn) == schema_of(dsn)  # dsn: migrated by `brooq migrate up`
        for name in reversed(migration_names()):
            with engine.begin() as connection:
                connection.execute(text(sql_of(name, rollback=True)))
        assert not has_job_table(empty_dsn)
    finally:
        engine.dispose()
