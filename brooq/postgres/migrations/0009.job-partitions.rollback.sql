-- Every row back into one plain table (a copy: seconds per million rows), with
-- the indexes, options and grants it had before 0009; the keys go back to the
-- unique index job_idempotency_idx.
CREATE TABLE job_plain (LIKE job INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS);
INSERT INTO job_plain SELECT * FROM job;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.privilege_type,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
        FROM pg_class c
        CROSS JOIN LATERAL aclexplode(c.relacl) AS a
        LEFT JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.oid = 'job'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE 'GRANT ' || g.privilege_type || ' ON job_plain TO ' || g.who;
    END LOOP;
END
$$;

DROP TABLE job;
DROP TABLE job_key;
DROP FUNCTION brooq_job_drop_partition(regclass, interval);
DROP FUNCTION brooq_job_create_partitions(interval, timestamptz, integer);
DROP FUNCTION brooq_job_time(uuid);
DROP FUNCTION brooq_job_bound(timestamptz);

ALTER TABLE job_plain RENAME TO job;
COMMENT ON TABLE job IS 'brooq jobs: pending -> processing -> done | failed | dead | canceled';
ALTER TABLE job ADD CONSTRAINT job_pkey PRIMARY KEY (id);
CREATE INDEX job_claim_idx ON job (topic, priority DESC, available_at, id)
    WHERE state IN ('pending', 'failed');
CREATE UNIQUE INDEX job_idempotency_idx ON job (topic, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX job_terminal_idx ON job (updated_at)
    WHERE state IN ('done', 'dead', 'canceled');
CREATE INDEX job_processing_idx ON job (topic, locked_until)
    WHERE state = 'processing';
ALTER TABLE job SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100);
