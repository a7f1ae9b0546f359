"""Prototype setup: 35 daily partitions, 400k done rows, ready_xid column + index."""
import sys
import os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import psycopg
from benchmarks.partitions import past_days, load_history

# A scratch database migrated with `brooq migrate up` (never one that matters: it truncates job).
DSN = os.environ["PROTO_DSN"]
with psycopg.connect(DSN, autocommit=True) as conn:
    conn.execute("TRUNCATE job, job_key, job_edge")
    start = past_days(conn, 35)
    load_history(conn, 400_000, start, 35)
    conn.execute("ALTER TABLE job ADD COLUMN IF NOT EXISTS ready_xid xid8")
    conn.execute("ALTER TABLE job ALTER COLUMN ready_xid SET DEFAULT pg_current_xact_id()")
    conn.execute("CREATE INDEX IF NOT EXISTS job_ready_xid_idx ON job (topic, ready_xid) "
                 "WHERE state IN ('pending', 'failed')")
    n = conn.execute("SELECT count(*) FROM pg_inherits WHERE inhparent='job'::regclass").fetchone()
    print("partitions", n)
