"""QUEUE_PGBOUNCER's connection profile on a direct connection: what the server is sent.

No startup options and no prepared statements; the statement timeout holds
inside each operation's transaction only, so nothing sticks to a server
connection that a transaction pooler would hand to someone else next.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from brooq.postgres import connect as connect_module
from brooq.postgres.connect import Connector, Source
from brooq.postgres.store import PostgresStore


@pytest.fixture
def bouncer_profile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(connect_module.PROFILE, "pgbouncer", True)
    yield


@pytest.mark.usefixtures("bouncer_profile")
def test_statement_timeout_is_local_to_each_operation(dsn: str) -> None:
    connector = Connector(Source(dsn, statement_timeout=timedelta(seconds=7)))
    try:
        with connector.connection() as conn:
            row = conn.execute("SHOW statement_timeout").fetchone()
            assert row == ("7s",)
            assert conn.prepare_threshold is None
            own = conn
        # After the operation the session is back to the server's default.
        row = own.execute("SHOW statement_timeout").fetchone()
        assert row is not None and row[0] != "7s"
        assert "statement_timeout" not in (own.info.get_parameters().get("options") or "")
        assert own.info.transaction_status.name == "IDLE"
    finally:
        connector.close()


@pytest.mark.usefixtures("bouncer_profile")
def test_the_store_works_and_prepares_nothing(dsn: str) -> None:
    store = PostgresStore(dsn, statement_timeout=timedelta(seconds=5))
    try:
        for _ in range(8):  # past psycopg's prepare threshold
            store.heartbeat([], timedelta(seconds=30))
            store.requeue_expired()
        with store.connector.connection() as conn:
            row = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
            assert row == (0,)
    finally:
        store.close()
