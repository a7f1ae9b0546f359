"""Layouts of job's partitions for tests: ranges in the past, rows with ids of a given time.

A fresh test database has the layout of migration 0009 (job_initial up to the
next UTC midnight, days ahead, the default partition), where nothing is old
enough for retention. ``past_layout`` rebuilds it, empty, with daily
partitions over the past days, as the owner of the table may.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

DAY = timedelta(days=1)


def uuid_at(at: datetime) -> str:
    """A UUIDv7 made at ``at`` (its millisecond, then random bits), as brooq makes them."""
    ms = int(at.timestamp() * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 68) & 0xFFF) << 64 | 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def bound(at: datetime) -> str:
    """The smallest UUIDv7 of ``at``'s millisecond (brooq_job_bound), as a quoted literal."""
    h = f"{int(at.timestamp() * 1000) << 80:032x}"
    return f"'{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}'"


def midnight(at: datetime) -> datetime:
    """The UTC midnight that starts ``at``'s day."""
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def past_layout(pg: psycopg.Connection[Any], days: int) -> list[str]:
    """Rebuild job's (empty) layout: job_initial up to ``days`` ago at midnight, then a
    partition a day up to 3 days ahead; the names of the daily ones, oldest first."""
    assert pg.execute("SELECT count(*) FROM job").fetchone() == (0,), "an empty table only"
    names = [
        r[0]
        for r in pg.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'job'::regclass AND c.relname <> 'job_default'"
        )
    ]
    for name in names:
        pg.execute(f'DROP TABLE "{name}"')
    start = midnight(datetime.now(UTC)) - days * DAY
    pg.execute(
        f"CREATE TABLE job_initial PARTITION OF job FOR VALUES FROM (MINVALUE) TO ({bound(start)}) "
        "WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100)"
    )
    made = []
    for n in range(days + 3):
        lo = start + n * DAY
        name = f"job_p{lo:%Y%m%d}_000000"
        pg.execute(
            f'CREATE TABLE "{name}" PARTITION OF job FOR VALUES '
            f"FROM ({bound(lo)}) TO ({bound(lo + DAY)}) "
            "WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100)"
        )
        made.append(name)
    return made


def insert_rows(
    pg: psycopg.Connection[Any],
    at: datetime,
    states: list[str],
    *,
    topic: str = "work",
    keys: Sequence[str | None] | None = None,
    settled: datetime | None = None,
) -> list[str]:
    """Rows made at ``at`` (their ids say so) in ``states``, settled at ``settled`` (default
    ``at``), with ``keys`` written in job_key as the enqueue writes them; their ids."""
    ids = [uuid_at(at + timedelta(milliseconds=i)) for i in range(len(states))]
    keys = keys or [None] * len(states)
    for job_id, state, key in zip(ids, states, keys, strict=True):
        running = state == "processing"
        pg.execute(
            "INSERT INTO job (id, topic, state, attempts, idempotency_key, created_at, "
            "updated_at, locked_by, locked_until) VALUES (%s, %s, %s, 1, %s, %s, %s, %s, %s)",
            (
                job_id,
                topic,
                state,
                key,
                at,
                settled or at,
                "host:1:x" if running else None,
                datetime.now(UTC) + DAY if running else None,
            ),
        )
        if key is not None:
            pg.execute(
                "INSERT INTO job_key (topic, idempotency_key, job_id) VALUES (%s, %s, %s)",
                (topic, key, job_id),
            )
    return ids


def partition_of(pg: psycopg.Connection[Any], job_id: str) -> str | None:
    """The partition holding ``job_id`` (None: no such row)."""
    row = pg.execute("SELECT tableoid::regclass::text FROM job WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else str(row[0])


def partitions(pg: psycopg.Connection[Any]) -> set[str]:
    """The names of job's partitions now."""
    return {
        r[0]
        for r in pg.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'job'::regclass"
        )
    }


def keys(pg: psycopg.Connection[Any]) -> dict[tuple[str, str], str]:
    """job_key as (topic, key) → job id."""
    return {(r[0], r[1]): str(r[2]) for r in pg.execute("SELECT * FROM job_key")}
