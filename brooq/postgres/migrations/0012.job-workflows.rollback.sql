-- A waiting job has no state to go back to: refuse, saying what to do.
DO $$
BEGIN
    IF EXISTS (SELECT FROM job WHERE state = 'waiting') THEN
        RAISE EXCEPTION 'jobs are waiting for their parents: let their workflows finish, or '
            'cancel them (brooq jobs cancel --state waiting --topic …), then roll back again';
    END IF;
END
$$;

-- brooq_job_drop_partition as 0009 made it.
-- Drop one partition whose range ended more than `ttl` ago, if every row in it
-- is terminal and settled more than `ttl` ago, with its rows' idempotency keys,
-- in one transaction; the rows it held (an estimate), or NULL when it stays.
-- A partition holding a live row waits (it is never dropped, and its rows never
-- move). The live states are listed here: a new live state must be added.
-- Once across hosts, and each lock waits at most 100ms (as 0009 says).
CREATE OR REPLACE FUNCTION brooq_job_drop_partition(part regclass, ttl interval)
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

DROP TABLE job_edge;
DROP INDEX job_waiting_idx;
DROP INDEX job_workflow_idx;
ALTER TABLE job DROP COLUMN if_parent_fails;
ALTER TABLE job DROP COLUMN parents_left;
ALTER TABLE job DROP COLUMN workflow_id;
ALTER TABLE job DROP CONSTRAINT job_state_check;
ALTER TABLE job ADD CONSTRAINT job_state_check
    CHECK (state IN ('pending', 'processing', 'done', 'failed', 'dead', 'canceled'));
