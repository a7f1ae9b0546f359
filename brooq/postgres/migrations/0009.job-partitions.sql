-- depends: 0008.job-expiry-streak

-- job becomes a table partitioned by ranges of its id. brooq's ids are UUIDv7,
-- whose first 48 bits are the creation time in milliseconds, so a range of ids
-- is a range of time, the primary key stays (id), and every statement that
-- names an id reads one partition. No statement changes an id, so no row ever
-- moves between partitions. Old partitions whose rows are all terminal and
-- older than the retention TTL are dropped whole (brooq_job_drop_partition).
--
-- Idempotency keys move to a table of their own, job_key, written in the
-- enqueue's transaction: a unique index on a partitioned table must hold the
-- partition key, and a (topic, key) unique per partition would not be unique.
--
-- The upgrade keeps the existing table as the first partition (job_initial,
-- every id below the next UTC midnight): no row is copied or rewritten; the
-- keys are copied into job_key, and the table is scanned once to check its
-- ids fit the range. No supervisor may run meanwhile (docs/operations.md).
-- Plain SQL, without a percent sign or a colon before a word, so that it can
-- be pasted into an Alembic or Django migration.

-- The smallest UUIDv7 of a given millisecond: the bound of a partition.
CREATE FUNCTION brooq_job_bound(at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(substring(int8send(floor(extract(epoch FROM at) * 1000)::bigint) FROM 3)
                  || '\x00000000000000000000'::bytea, 'hex')::uuid
$$;

-- When a UUIDv7 was made (its first 48 bits): the time a bound stands for.
CREATE FUNCTION brooq_job_time(id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_timestamp(('x' || lpad(left(replace(id::text, '-', ''), 12), 16, '0'))::bit(64)::bigint
                        / 1000.0)
$$;

-- Idempotency per (topic, key) for the life of the job: written with the job in
-- the enqueue's statement, deleted with the job's row or its partition.
CREATE TABLE job_key (
    topic           text NOT NULL,
    idempotency_key text NOT NULL,
    job_id          uuid NOT NULL,
    CONSTRAINT job_key_pkey PRIMARY KEY (topic, idempotency_key)
);
INSERT INTO job_key (topic, idempotency_key, job_id)
SELECT topic, idempotency_key, id FROM job WHERE idempotency_key IS NOT NULL;
-- A dropped partition takes its keys by id range.
CREATE INDEX job_key_job_idx ON job_key (job_id);

-- The table as it is becomes the first partition, under new names.
ALTER TABLE job RENAME TO job_initial;
ALTER INDEX job_pkey RENAME TO job_initial_pkey;
ALTER INDEX job_claim_idx RENAME TO job_initial_claim_idx;
ALTER INDEX job_terminal_idx RENAME TO job_initial_terminal_idx;
ALTER INDEX job_processing_idx RENAME TO job_initial_processing_idx;
DROP INDEX job_idempotency_idx;

-- Same columns, defaults and checks; the indexes are declared on the parent and
-- every partition has them (the existing ones of job_initial are adopted).
CREATE TABLE job (LIKE job_initial INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS)
    PARTITION BY RANGE (id);
COMMENT ON TABLE job IS 'brooq jobs: pending -> processing -> done | failed | dead | canceled';
ALTER TABLE job ADD CONSTRAINT job_pkey PRIMARY KEY (id);
CREATE INDEX job_claim_idx ON job (topic, priority DESC, available_at, id)
    WHERE state IN ('pending', 'failed');
CREATE INDEX job_terminal_idx ON job (updated_at)
    WHERE state IN ('done', 'dead', 'canceled');
CREATE INDEX job_processing_idx ON job (topic, locked_until)
    WHERE state = 'processing';

-- Ids outside every created range (ids not made by brooq, or made while no
-- partition was created ahead) land here; creating their range moves them out.
CREATE TABLE job_default PARTITION OF job DEFAULT
    WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100);

WITH moved AS (
    DELETE FROM job_initial
    WHERE id >= brooq_job_bound(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                                + interval '1 day')
    RETURNING *
)
INSERT INTO job_default SELECT * FROM moved;

ALTER TABLE job ATTACH PARTITION job_initial FOR VALUES FROM (MINVALUE)
    TO (brooq_job_bound(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                        + interval '1 day'));

-- The roles that could use the old table may use the new one and its keys.
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
        WHERE c.oid = 'job_initial'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE 'GRANT ' || g.privilege_type || ' ON job, job_key TO ' || g.who;
    END LOOP;
END
$$;

-- Partitions ahead: from the end of the newest range, steps of `step` up to
-- `until` (at most `most` new ones a call); a range that lies behind now() is
-- widened to now's step, so a long pause makes one partition, not hundreds.
-- Rows of the default partition in a new range move into it. Runs as the
-- table's owner (SECURITY DEFINER): the roles that run brooq need only DML.
-- Once across hosts (an advisory lock; a busy call returns nothing), and each
-- lock waits at most 100ms (lock_timeout raises: retried on the next tick).
CREATE FUNCTION brooq_job_create_partitions(step interval, until timestamptz, most integer)
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '100ms'
AS $$
DECLARE
    lo timestamptz;
    hi timestamptz;
    made integer := 0;
    name text;
BEGIN
    IF step < interval '1 hour' THEN
        RAISE EXCEPTION USING MESSAGE = 'partition step must be at least 1 hour, not ' || step;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('brooq.job_partitions', 0)) THEN
        RETURN;
    END IF;
    SELECT max(brooq_job_time(substring(pg_get_expr(c.relpartbound, c.oid)
                                        FROM 'TO \(''([0-9a-f-]+)''\)')::uuid))
    INTO lo
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'job'::regclass;
    WHILE lo < until AND made < most LOOP
        hi := lo + step;
        IF hi < now() THEN
            hi := lo + step * ceil(extract(epoch FROM now() - lo) / extract(epoch FROM step));
        END IF;
        name := 'job_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS');
        EXECUTE 'CREATE TABLE ' || quote_ident(name)
            || ' (LIKE job INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'
            || ' WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100)';
        EXECUTE 'WITH moved AS (DELETE FROM job_default WHERE id >= $1 AND id < $2 RETURNING *) '
            || 'INSERT INTO ' || quote_ident(name) || ' SELECT * FROM moved'
            USING brooq_job_bound(lo), brooq_job_bound(hi);
        EXECUTE 'ALTER TABLE job ATTACH PARTITION ' || quote_ident(name) || ' FOR VALUES FROM ('
            || quote_literal(brooq_job_bound(lo)) || ') TO (' || quote_literal(brooq_job_bound(hi))
            || ')';
        RETURN NEXT name;
        made := made + 1;
        lo := hi;
    END LOOP;
END
$$;

-- Drop one partition whose range ended more than `ttl` ago, if every row in it
-- is terminal and settled more than `ttl` ago, with its rows' idempotency keys,
-- in one transaction; the rows it held (an estimate), or NULL when it stays.
-- A partition holding a live row waits (it is never dropped, and its rows never
-- move). The live states are listed here: a new live state must be added.
-- Once across hosts, and each lock waits at most 100ms (see above).
CREATE FUNCTION brooq_job_drop_partition(part regclass, ttl interval)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '100ms'
AS $$
DECLARE
    bound text;
    lo uuid;
    hi uuid;
    busy boolean;
    estimate bigint;
BEGIN
    IF ttl IS NULL OR ttl <= interval '0' THEN
        RAISE EXCEPTION USING MESSAGE = 'retention TTL must be positive, not ' || coalesce(ttl::text, 'null');
    END IF;
    SELECT pg_get_expr(c.relpartbound, c.oid), greatest(c.reltuples, 0)::bigint
    INTO bound, estimate
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'job'::regclass AND c.oid = part;
    IF bound IS NULL OR bound = 'DEFAULT' THEN
        RETURN NULL;
    END IF;
    lo := substring(bound FROM 'FROM \(''([0-9a-f-]+)''\)')::uuid;
    hi := substring(bound FROM 'TO \(''([0-9a-f-]+)''\)')::uuid;
    IF hi IS NULL OR hi > brooq_job_bound(now() - ttl) THEN
        RETURN NULL;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('brooq.job_partitions', 0)) THEN
        RETURN NULL;
    END IF;
    -- Nothing reads or writes job while it is checked and dropped: milliseconds.
    LOCK TABLE ONLY job IN ACCESS EXCLUSIVE MODE;
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM ' || part || ' WHERE state IN (''pending'', ''failed''))'
        || ' OR EXISTS (SELECT 1 FROM ' || part || ' WHERE state = ''processing'')'
        || ' OR EXISTS (SELECT 1 FROM ' || part
        || ' WHERE state IN (''done'', ''dead'', ''canceled'') AND updated_at >= now() - $1)'
        INTO busy USING ttl;
    IF busy THEN
        RETURN NULL;
    END IF;
    DELETE FROM job_key WHERE (lo IS NULL OR job_id >= lo) AND job_id < hi;
    EXECUTE 'DROP TABLE ' || part;
    RETURN estimate;
END
$$;

-- The days ahead, as brooq's maintenance keeps them (QUEUE_PARTITION_INTERVAL).
DO $$
BEGIN
    PERFORM brooq_job_create_partitions(interval '1 day', now() + interval '3 days', 8);
END
$$;
