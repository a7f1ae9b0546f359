"""The test rig: a real PostgreSQL for every database test, never a skip.

With TEST_DATABASE_URL unset, the session starts the project's throwaway
cluster (scripts/pg.sh up) and connects as its role ``brooq``: not a
superuser, but CREATEDB, and the owner of every database it creates. Each
test that asks for ``dsn`` gets a fresh database cloned from a migrated
template, so tests are isolated and can run in any order. The few tests that
need a superuser ask for ``admin_url``. Under CI=true any skipped test fails
the run.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql

from brooq.engine.fake import InMemoryStore
from brooq.osproc import pid_alive
from brooq.postgres import migrations
from brooq.postgres.store import PostgresStore

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()


PG_SH = str(ROOT / "scripts" / "pg.sh")


def _server_url() -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    done = subprocess.run([PG_SH, "up"], capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"could not start the test PostgreSQL:\n{done.stderr}")
    return subprocess.run([PG_SH, "url"], capture_output=True, text=True, check=True).stdout.strip()


def _with_db(url: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def _drop_stale(admin: psycopg.Connection) -> None:
    # Only databases this role may drop (it owns them), so a stray one never breaks the session.
    names = [
        r[0]
        for r in admin.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'brooq\\_t%' "
            "AND pg_has_role(current_user, datdba, 'MEMBER')"
        )
    ]
    for name in names:
        try:
            pid = int(name.split("_")[1].lstrip("tpl").lstrip("t") or 0)
        except (IndexError, ValueError):
            continue
        if pid and not pid_alive(pid):
            admin.execute(
                pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
            )


@pytest.fixture(scope="session")
def server_url() -> str:
    """URL of a database on the test server (the cluster's maintenance DB is reachable)."""
    return _server_url()


@pytest.fixture(scope="session")
def admin_url(server_url: str) -> str:
    """URL of a superuser on the test server, for the few tests that need one.

    TEST_ADMIN_DATABASE_URL, or scripts/pg.sh's ``brooq_admin`` (a random
    password) when the server is the one pg.sh started.
    """
    url = os.environ.get("TEST_ADMIN_DATABASE_URL")
    if url:
        return url
    if os.environ.get("TEST_DATABASE_URL"):
        pytest.fail(
            "TEST_DATABASE_URL names another server: set TEST_ADMIN_DATABASE_URL to a "
            "superuser on it"
        )
    return subprocess.run(
        [PG_SH, "admin-url"], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="session")
def admin(server_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection for creating and dropping test databases.

    The test role is enough: CREATEDB, and it owns (so may drop) what it creates.
    """
    with psycopg.connect(_with_db(server_url, "postgres"), autocommit=True) as conn:
        _drop_stale(conn)
        yield conn


@pytest.fixture(scope="session")
def template_db(admin: psycopg.Connection, server_url: str) -> Iterator[str]:
    """A database with every migration applied, cloned for each test."""
    name = f"brooq_tpl{os.getpid()}"
    admin.execute(
        pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
    )
    admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    migrations.up(_with_db(server_url, name))
    yield name
    admin.execute(
        pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
    )


@pytest.fixture
def empty_dsn(admin: psycopg.Connection, server_url: str) -> Iterator[str]:
    """A fresh database without the schema (for migration tests)."""
    yield from _fresh_db(admin, server_url, template=None)


@pytest.fixture
def dsn(admin: psycopg.Connection, server_url: str, template_db: str) -> Iterator[str]:
    """A fresh migrated database for this test only."""
    yield from _fresh_db(admin, server_url, template=template_db)


def _fresh_db(admin: psycopg.Connection, server_url: str, template: str | None) -> Iterator[str]:
    name = f"brooq_t{os.getpid()}_{next(_counter)}"
    create = "CREATE DATABASE {} TEMPLATE {}" if template else "CREATE DATABASE {}"
    idents = [pgsql.Identifier(name)] + ([pgsql.Identifier(template)] if template else [])
    admin.execute(pgsql.SQL(create).format(*idents))
    try:
        yield _with_db(server_url, name)
    finally:
        admin.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
        )


@pytest.fixture
def pg(dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test database, for arranging and inspecting rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def pg_store(dsn: str) -> Iterator[PostgresStore]:
    """The real store on a fresh database."""
    store = PostgresStore(dsn)
    yield store
    store.close()


class Clock:
    """A settable clock for the in-memory store."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        """Move time forward."""
        self.now += delta


@pytest.fixture
def clock() -> Clock:
    """A clock starting at 2026-01-01 UTC."""
    return Clock()


@pytest.fixture
def fake_store(clock: Clock) -> InMemoryStore:
    """The in-memory store on a settable clock."""
    return InMemoryStore(clock)


_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember skipped tests: under CI they fail the run."""
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI, a skipped test is a failure: the database tests must really run."""
    if os.environ.get("CI") and _skipped:
        sys.stderr.write("\nCI forbids skipped tests; skipped:\n  " + "\n  ".join(_skipped) + "\n")
        session.exitstatus = 1


# --- tiers: the folder a test lives in is its tier (tests/README.md) -----------------------

TIERS: dict[str, tuple[str, ...]] = {
    "unit": ("unit",),
    "deploy": ("deploy",),
    "integration": ("integration", "db"),
    "system": ("system", "db"),
    "chaos": ("chaos", "system", "db"),
    "browser": ("browser", "db"),
}
"""The markers each folder's tests get, so ``pytest -m "not db"`` needs no database."""
DATABASE_FIXTURES = {
    "server_url",
    "admin_url",
    "admin",
    "template_db",
    "dsn",
    "empty_dsn",
    "pg",
    "pg_store",
}
"""Fixtures that reach PostgreSQL: a test below a database-free tier may not ask for them."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its folder's tier; refuse database fixtures in database-free tiers."""
    root = Path(__file__).resolve().parent
    misplaced = []
    for item in items:
        try:
            tier = item.path.resolve().relative_to(root).parts[0]
        except ValueError:
            continue
        for marker in TIERS.get(tier, ()):
            item.add_marker(marker)
        callspec = getattr(item, "callspec", None)
        parametrized = set(callspec.params) if callspec is not None else set()
        used = DATABASE_FIXTURES & (set(getattr(item, "fixturenames", ())) - parametrized)
        if "db" not in TIERS.get(tier, ("db",)) and used:
            misplaced.append(f"{item.nodeid} uses {sorted(used)}")
    if misplaced:
        raise pytest.UsageError(
            "database fixtures in a database-free tier (move the test to "
            "tests/integration):\n  " + "\n  ".join(misplaced)
        )
