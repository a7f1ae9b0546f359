-- depends: 0006.job-last-traceback

-- Supervisors alive against this database, across hosts: each supervisor
-- upserts its row every few seconds (seen_at) with a snapshot of its workers,
-- and deletes it at a clean stop. A row not seen for a while belongs to a
-- supervisor that died; any supervisor deletes such rows. Read by
-- `brooq workers`, `brooq status` and the dashboard.
CREATE TABLE brooq_supervisor (
    holder     text PRIMARY KEY,
    host       text NOT NULL,
    pid        integer NOT NULL,
    app        text NOT NULL DEFAULT '',
    topics     text[] NOT NULL DEFAULT '{}',
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    workers    jsonb NOT NULL DEFAULT '[]'
);
