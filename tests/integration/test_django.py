"""brooq inside Django's ``transaction.atomic()`` (psycopg 3 backend): the job shares its fate.

Django is configured once per test process (``settings.configure``); each
test points the ``default`` connection at its own fresh database.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import django
import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections, transaction

import brooq
from brooq.integrations import NotPsycopg3, django_connection
from brooq.postgres.store import PostgresStore
from tests.integration.schema import has_job_table, migration_names, schema_of, sql_of

pytestmark = pytest.mark.db

LEASE = timedelta(minutes=1)


def database_settings(dsn: str) -> dict[str, Any]:
    """Django's DATABASES entry for a libpq DSN."""
    params = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.pop("dbname"),
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": params.pop("port", ""),
        "OPTIONS": params,
    }


@pytest.fixture
def django_db(dsn: str, pg: psycopg.Connection[Any]) -> Iterator[None]:
    """Django's default database is this test's database (with a table ``orders``)."""
    pg.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    if not settings.configured:
        settings.configure(
            DATABASES={"default": database_settings(dsn)}, INSTALLED_APPS=[], USE_TZ=True
        )
        django.setup()
    connections.close_all()
    connection.settings_dict.update(database_settings(dsn))
    yield
    connections.close_all()


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


@pytest.mark.usefixtures("django_db")
def test_the_backend_is_psycopg_3() -> None:
    assert connection.vendor == "postgresql"
    assert isinstance(django_connection(), psycopg.Connection)


@pytest.mark.usefixtures("django_db")
def test_rollback_leaves_neither_the_row_nor_the_job(
    queue: brooq.Queue,
    pg: psycopg.Connection[Any],
) -> None:
    with pytest.raises(Boom), transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders (id) VALUES (1)")
        # The documented spelling, without the helper.
        _, created = queue.enqueue(
            brooq.Job(topic="email.send", payload={"order": 1}, idempotency_key="order-1"),
            conn=connection.connection,
        )
        assert created
        raise Boom
    assert jobs(pg) == []
    assert pg.execute("SELECT count(*) FROM orders").fetchone() == (0,)


@pytest.mark.usefixtures("django_db")
def test_commit_makes_the_job_claimable(
    queue: brooq.Queue,
    dsn: str,
    pg: psycopg.Connection[Any],
) -> None:
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders (id) VALUES (1)")
        job_id, created = queue.enqueue(
            brooq.Job(topic="email.send", payload={"order": 1}, idempotency_key="order-1"),
            conn=django_connection(),
        )
        assert created
        assert jobs(pg) == []  # nobody else sees it before the commit
    assert jobs(pg) == [(job_id, "email.send", "order-1")]
    assert pg.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    store = PostgresStore(dsn)
    try:
        claimed = store.claim("test:1", ["email.send"], LEASE)
        assert claimed is not None
        assert claimed.ticket.job_id == job_id
        assert claimed.payload == {"order": 1}
    finally:
        store.close()


@pytest.mark.usefixtures("django_db")
def test_many_jobs_and_a_duplicate_key_under_django_cursors(
    queue: brooq.Queue,
    pg: psycopg.Connection[Any],
) -> None:
    """Django's client-side-binding cursors carry brooq's array parameters too."""
    with transaction.atomic():
        conn = django_connection()
        first = queue.enqueue_many(
            [
                brooq.Job(topic="email.send", payload={"n": 1}, idempotency_key="k"),
                brooq.Job(topic="email.send", payload=[1, "two", None]),
            ],
            conn=conn,
        )
        again = queue.enqueue(brooq.Job(topic="email.send", idempotency_key="k"), conn=conn)
    assert [e.created for e in first] == [True, True]
    assert again == (first[0].id, False)
    payloads = [r[0] for r in pg.execute("SELECT payload FROM job ORDER BY id")]
    assert payloads == [{"n": 1}, [1, "two", None]]


@pytest.mark.usefixtures("django_db")
def test_a_savepoint_rollback_takes_the_job_with_it(
    queue: brooq.Queue,
    pg: psycopg.Connection[Any],
) -> None:
    with transaction.atomic():
        queue.enqueue(brooq.Job(topic="kept"), conn=django_connection())
        with pytest.raises(Boom), transaction.atomic():
            queue.enqueue(brooq.Job(topic="dropped"), conn=django_connection())
            raise Boom
    assert [t for _, t, _ in jobs(pg)] == ["kept"]


def test_a_connection_that_is_not_psycopg_3_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Wrapper:
        connection = object()

        def ensure_connection(self) -> None:
            pass

    monkeypatch.setattr("django.db.connections", {"other": Wrapper()})
    with pytest.raises(NotPsycopg3, match="psycopg 3"):
        django_connection("other")


# -- the schema from Django migrations: RunSQL(<file>, reverse_sql=<rollback file>) ------------


def test_the_migration_files_through_run_sql_build_the_same_schema(
    django_db: None,
    empty_dsn: str,
    dsn: str,
) -> None:
    """What docs/integrations.md tells Django users to write, run forwards and backwards."""
    from django.db import migrations
    from django.db.migrations.state import ProjectState

    connections.close_all()
    connection.settings_dict.update(database_settings(empty_dsn))
    operations = [
        migrations.RunSQL(sql_of(name), reverse_sql=sql_of(name, rollback=True))
        for name in migration_names()
    ]
    state = ProjectState()
    with connection.schema_editor() as editor:
        for operation in operations:
            operation.database_forwards("myapp", editor, state, state)
    assert schema_of(empty_dsn) == schema_of(dsn)  # dsn: migrated by `brooq migrate up`
    with connection.schema_editor() as editor:
        for operation in reversed(operations):
            operation.database_backwards("myapp", editor, state, state)
    assert not has_job_table(empty_dsn)
