"""The shape of brooq's schema, to compare a database migrated one way with one migrated another."""

from __future__ import annotations

from typing import Any

import psycopg

from brooq.postgres.migrations import migrations_dir


def migration_names() -> list[str]:
    """The migrations in order, by file stem (``0001.job``), without rollbacks."""
    return sorted(
        p.name.removesuffix(".sql")
        for p in migrations_dir().glob("*.sql")
        if not p.name.endswith(".rollback.sql")
    )


def sql_of(name: str, rollback: bool = False) -> str:
    """The text of one migration or of its rollback."""
    return (migrations_dir() / f"{name}{'.rollback' if rollback else ''}.sql").read_text()


def schema_of(dsn: str) -> dict[str, Any]:
    """Columns, constraints, indexes, options and functions of brooq's objects."""
    with psycopg.connect(dsn) as conn:

        def rows(query: str) -> list[tuple[Any, ...]]:
            return sorted(conn.execute(query).fetchall(), key=repr)

        return {
            "columns": rows(
                "SELECT column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_name = 'job'"
            ),
            "constraints": rows(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = to_regclass('job')"
            ),
            "indexes": rows("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'job'"),
            "options": rows("SELECT reloptions FROM pg_class WHERE relname = 'job'"),
            "functions": rows("SELECT proname, prosrc FROM pg_proc WHERE proname LIKE 'brooq%'"),
        }


def has_job_table(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regclass('job') IS NOT NULL").fetchone()
    return bool(row and row[0])
