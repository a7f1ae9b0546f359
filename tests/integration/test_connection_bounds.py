"""The idle bound of a worker's connection (issue 32, item 2), directly and through the
PgBouncer profile: a transaction left idle past it ends its session, and its locks with it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from brooq.postgres import connect as connect_module
from brooq.postgres.store import PostgresStore
from brooq.vocabulary import StoreUnavailable

pytestmark = pytest.mark.db


@pytest.fixture(params=["direct", "pgbouncer"])
def profile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with the direct profile (startup options) and the PgBouncer one
    (``SET LOCAL`` in each operation's transaction)."""
    monkeypatch.setattr(connect_module.PROFILE, "pgbouncer", request.param == "pgbouncer")
    yield request.param


def test_a_transaction_left_idle_past_the_bound_ends_its_session_and_frees_its_rows(
    dsn: str, pg: psycopg.Connection[Any], profile: str
) -> None:
    inserted = pg.execute("INSERT INTO job (topic, payload) VALUES ('a', '{}') RETURNING id")
    job_id = inserted.fetchone()
    assert job_id is not None
    store = PostgresStore(
        dsn, statement_timeout=timedelta(seconds=5), idle_timeout=timedelta(seconds=1)
    )
    try:
        with store.connector.connection() as conn:
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("1s",)
            assert conn.execute("SHOW statement_timeout").fetchone() == ("5s",)
        with (
            pytest.raises(StoreUnavailable, match="idle-in-transaction timeout"),
            store.connector.connection() as conn,
            conn.transaction(),
        ):
            conn.execute("SELECT id FROM job WHERE id = %s FOR UPDATE", job_id)
            time.sleep(1.5)  # a hook that waits, or a worker that died: idle in transaction
        # The row is free at once for another session, and the store works again.
        pg.execute("SELECT id FROM job WHERE id = %s FOR UPDATE NOWAIT", job_id)
        with store.connector.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        store.close()
