"""The schema's migrations (plain SQL, yoyo format), applied as a deploy step.

The worker never migrates: ``brooq migrate up|down|status`` and ``make
migrate-*`` call these functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from yoyo import get_backend, read_migrations

from brooq.postgres.connect import unavailable

MIGRATIONS_PACKAGE_DIR = "migrations"


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    """One migration and whether it is applied."""

    id: str
    applied: bool


def migrations_dir() -> Path:
    """The folder holding the SQL migrations shipped with this package."""
    resource = files("brooq.postgres").joinpath(MIGRATIONS_PACKAGE_DIR)
    with as_file(resource) as path:
        return Path(path)


def yoyo_uri(dsn: str) -> str:
    """The yoyo URI (psycopg 3 backend) for a libpq DSN or postgres URL."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = str(params.pop("host", "") or "")
    port = params.pop("port", None)
    netloc = f"{auth}{host}" + (f":{port}" if port else "")
    dbname = quote(str(params.pop("dbname", "") or ""), safe="")
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"postgresql+psycopg://{netloc}/{dbname}" + (f"?{query}" if query else "")


@contextlib.contextmanager
def _backend(dsn: str) -> Iterator[Any]:
    try:
        backend = get_backend(yoyo_uri(dsn))
    except psycopg.Error as exc:
        raise unavailable(exc, dsn) from None
    try:
        yield backend
    finally:
        backend.connection.close()


def status(dsn: str) -> list[MigrationStatus]:
    """Every shipped migration, in order, with whether it is applied."""
    with _backend(dsn) as backend:
        applied = backend.get_applied_migration_hashes()
    return [
        MigrationStatus(m.id, m.hash in applied) for m in read_migrations(str(migrations_dir()))
    ]


def up(dsn: str) -> list[str]:
    """Apply every pending migration; return the ids applied (empty when up to date)."""
    with _backend(dsn) as backend, backend.lock():
        pending = backend.to_apply(read_migrations(str(migrations_dir())))
        backend.apply_migrations(pending)
    return [m.id for m in pending]


def down(dsn: str, steps: int | None = 1) -> list[str]:
    """Roll back the latest ``steps`` applied migrations (all when None); return their ids."""
    with _backend(dsn) as backend, backend.lock():
        applied = backend.to_rollback(read_migrations(str(migrations_dir())))
        chosen = applied if steps is None else applied[:steps]
        backend.rollback_migrations(chosen)
    return [m.id for m in chosen]
