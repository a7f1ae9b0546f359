"""The schema's migrations (plain SQL, yoyo format), applied as a deploy step.

The worker never migrates: ``brooq migrate up|down|status`` and ``make
migrate-*`` call these functions. :func:`every_migration` is the one list of
them, in order: ``brooq migrate`` applies it, and an Alembic or Django
migration built from it (docs/integrations.md) can never miss one.
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

from brooq.postgres.behind import missing_privilege
from brooq.postgres.connect import connect, unavailable
from brooq.postgres.sql import sql

MIGRATIONS_PACKAGE_DIR = "migrations"
YOYO_TABLE = "_yoyo_migration"
"""Where ``brooq migrate`` records what it applied (yoyo's bookkeeping table)."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One shipped migration: its id (the file's stem, ``0001.job``) and its SQL both ways."""

    id: str
    sql: str
    """The migration: plain PostgreSQL, to run as it is (``op.execute``, ``RunSQL``)."""
    rollback_sql: str
    """What undoes it."""


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


def every_migration() -> Iterator[Migration]:
    """Every migration this brooq ships, in the order they apply (oldest first).

    Raises FileNotFoundError naming a migration whose rollback is missing.
    """
    folder = migrations_dir()
    for path in sorted(folder.glob("*.sql")):
        if path.name.endswith(".rollback.sql"):
            continue
        stem = path.name.removesuffix(".sql")
        back = folder / f"{stem}.rollback.sql"
        if not back.is_file():
            raise FileNotFoundError(f"migration {stem} has no rollback ({back.name})")
        yield Migration(stem, path.read_text(encoding="utf-8"), back.read_text(encoding="utf-8"))


def migration_ids() -> list[str]:
    """The ids of :func:`every_migration`, in order."""
    return [m.id for m in every_migration()]


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
    from yoyo import get_backend  # only migrate needs yoyo: every command checks the schema

    try:
        backend = get_backend(yoyo_uri(dsn))
    except psycopg.Error as exc:
        raise unavailable(exc, dsn) from None
    try:
        yield backend
    finally:
        backend.connection.close()


def _shipped() -> Any:
    """yoyo's view of :func:`every_migration` (the same files, checked to be the same list)."""
    from yoyo import read_migrations

    found = read_migrations(str(migrations_dir()))
    if [m.id for m in found] != migration_ids():
        raise RuntimeError("yoyo reads other migrations than every_migration() lists")
    return found


def applied_ids(dsn: str) -> list[str]:
    """The migration ids ``brooq migrate`` recorded as applied; reads only, writes nothing.

    Empty when it never ran here (no bookkeeping table: a fresh database, or
    one migrated from Alembic or Django).
    """
    try:
        with connect(dsn, prepare=False) as conn:
            row = conn.execute(sql("yoyo_table_exists")).fetchone()
            if not row or not row[0]:
                return []
            return [str(r[0]) for r in conn.execute(sql("yoyo_applied_ids"))]
    except psycopg.errors.InsufficientPrivilege as exc:
        raise missing_privilege(exc) from None
    except psycopg.Error as exc:
        raise unavailable(exc, dsn) from None


def status(dsn: str) -> list[MigrationStatus]:
    """Every shipped migration, in order, with whether it is applied; read-only.

    A migration that ``brooq migrate`` did not record (an older brooq's, or a
    file this brooq does not ship) is listed after the shipped ones.
    """
    applied = applied_ids(dsn)
    shipped = migration_ids()
    return [MigrationStatus(m, m in applied) for m in shipped] + [
        MigrationStatus(m, True) for m in applied if m not in shipped
    ]


def up(dsn: str) -> list[str]:
    """Apply every pending migration; return the ids applied (empty when up to date)."""
    with _backend(dsn) as backend, backend.lock():
        pending = backend.to_apply(_shipped())
        backend.apply_migrations(pending)
    return [m.id for m in pending]


def down(dsn: str, steps: int | None = 1) -> list[str]:
    """Roll back the latest ``steps`` applied migrations (all when None); return their ids."""
    with _backend(dsn) as backend, backend.lock():
        applied = backend.to_rollback(_shipped())
        chosen = applied if steps is None else applied[:steps]
        backend.rollback_migrations(chosen)
    return [m.id for m in chosen]
