"""Migrations apply to an empty database, roll back completely, and apply again."""

from __future__ import annotations

import psycopg

from brooq.postgres import migrations

ALL = [
    "0001.job",
    "0002.job-indexes",
    "0003.job-autovacuum",
    "0004.job-priority",
    "0005.job-expirations",
    "0006.job-last-traceback",
    "0007.supervisor",
    "0008.job-expiry-streak",
    "0011.rate-limit",
]


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {
            r[0]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }


def _schema(dsn: str) -> list[tuple[str, ...]]:
    with psycopg.connect(dsn) as conn:
        cols = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = 'job' ORDER BY ordinal_position"
        ).fetchall()
        idx = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'job' ORDER BY indexname"
        ).fetchall()
        opts = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'job'").fetchall()
    return [tuple(map(str, r)) for r in cols + idx + opts]


def test_up_down_up(empty_dsn: str) -> None:
    assert not any(s.applied for s in migrations.status(empty_dsn))
    applied = migrations.up(empty_dsn)
    assert applied == ALL
    assert "job" in _tables(empty_dsn)
    first = _schema(empty_dsn)
    assert migrations.up(empty_dsn) == []

    rolled = migrations.down(empty_dsn, steps=None)
    assert rolled == ALL[::-1]
    assert "job" not in _tables(empty_dsn)
    assert not any(s.applied for s in migrations.status(empty_dsn))

    migrations.up(empty_dsn)
    assert _schema(empty_dsn) == first


def test_schema_has_the_promised_pieces(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        indexes = {
            r[0]: r[1]
            for r in conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'job'"
            )
        }
        checks = [
            r[0]
            for r in conn.execute(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = 'job'::regclass AND contype = 'c'"
            )
        ]
        row = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'job'").fetchone()
        assert row is not None
        (opts,) = row
    claimable = "WHERE (state = ANY (ARRAY['pending'::text, 'failed'::text]))"
    assert claimable in indexes["job_claim_idx"]
    assert "UNIQUE" in indexes["job_idempotency_idx"]
    assert "idempotency_key IS NOT NULL" in indexes["job_idempotency_idx"]
    assert "done" in indexes["job_terminal_idx"] and "updated_at" in indexes["job_terminal_idx"]
    assert any("canceled" in c and "processing" in c and "dead" in c for c in checks)
    assert set(opts) == {"autovacuum_vacuum_scale_factor=0.02", "autovacuum_vacuum_threshold=100"}


def test_down_one_step(empty_dsn: str) -> None:
    migrations.up(empty_dsn)
    assert migrations.down(empty_dsn) == [ALL[-1]]
    assert [s.applied for s in migrations.status(empty_dsn)] == [True] * (len(ALL) - 1) + [False]
