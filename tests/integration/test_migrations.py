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
    "0009.job-partitions",
    "0010.job-result",
    "0011.rate-limit",
    "0012.job-workflows",
    "0013.job-overrides",
    "0014.topic-pause",
    "0015.app-versions",
    "0016.fair-cursor",
    "0017.ready-xid",
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
        opts = conn.execute(
            "SELECT relname, reloptions FROM pg_class "
            "WHERE relname IN ('job', 'job_default', 'job_initial') ORDER BY relname"
        ).fetchall()
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
        # A partitioned table holds no storage options: every partition has them.
        options = conn.execute(
            "SELECT c.relname, c.reloptions FROM pg_inherits i JOIN pg_class c "
            "ON c.oid = i.inhrelid WHERE i.inhparent = 'job'::regclass"
        ).fetchall()
        key = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'job_key'::regclass AND contype = 'p'"
        ).fetchone()
    claimable = "WHERE (state = ANY (ARRAY['pending'::text, 'failed'::text]))"
    assert claimable in indexes["job_claim_idx"]
    assert key == ("PRIMARY KEY (topic, idempotency_key)",)
    assert "done" in indexes["job_terminal_idx"] and "updated_at" in indexes["job_terminal_idx"]
    assert any("canceled" in c and "processing" in c and "dead" in c for c in checks)
    assert len(options) >= 3  # the first partition, the default, the days ahead
    for _, opts in options:
        assert set(opts) == {
            "autovacuum_vacuum_scale_factor=0.02",
            "autovacuum_vacuum_threshold=100",
        }


def test_down_one_step(empty_dsn: str) -> None:
    migrations.up(empty_dsn)
    assert migrations.down(empty_dsn) == [ALL[-1]]
    assert [s.applied for s in migrations.status(empty_dsn)] == [True] * (len(ALL) - 1) + [False]
