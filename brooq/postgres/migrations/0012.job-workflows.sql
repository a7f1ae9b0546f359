-- depends: 0011.rate-limit

-- Workflows: a job may wait for other jobs (its parents). It is enqueued in the
-- seventh state, `waiting`, which no claim takes; the statement that ends its last
-- parent makes it `pending` (or `canceled`, by its policy), in that parent's
-- settle transaction. See docs/architecture.md, "Workflows".
ALTER TABLE job DROP CONSTRAINT job_state_check;
ALTER TABLE job ADD CONSTRAINT job_state_check
    CHECK (state IN ('pending', 'processing', 'done', 'failed', 'dead', 'canceled', 'waiting'));

-- The workflow a job was enqueued in (queue.enqueue_workflow); NULL for the others.
ALTER TABLE job ADD COLUMN workflow_id uuid;
-- How many of the job's parents have not ended: a counter on the child's own row, so
-- that two parents ending at once are serialized by its row lock, and exactly one of
-- them brings it to zero.
ALTER TABLE job ADD COLUMN parents_left integer NOT NULL DEFAULT 0;
-- What a parent that ends dead or canceled (or does not exist) does to the job:
-- cancel it, or let it run once every parent has ended. NULL: the job has no parents.
ALTER TABLE job ADD COLUMN if_parent_fails text;
ALTER TABLE job ADD CONSTRAINT job_if_parent_fails_check
    CHECK (if_parent_fails IN ('cancel', 'run'));

-- queue.cancel_workflow and `brooq jobs cancel --workflow` find a workflow's jobs.
CREATE INDEX job_workflow_idx ON job (workflow_id) WHERE workflow_id IS NOT NULL;

-- One row per edge: the child waits for the parent. No foreign key: job may be
-- partitioned, and a parent may be gone (deleted by hand, or never existed), which a
-- child resolves by its policy. parent_state is the parent's end as the edge saw it,
-- NULL while the parent has not ended: an edge is resolved once, by the statement
-- that moves it from NULL (its row lock makes that statement the only one).
CREATE TABLE job_edge (
    parent_id    uuid NOT NULL,
    child_id     uuid NOT NULL,
    parent_state text,
    PRIMARY KEY (parent_id, child_id),
    CONSTRAINT job_edge_parent_state_check
        CHECK (parent_state IN ('done', 'dead', 'canceled', 'missing'))
);

-- A partition's waiting rows, found by one probe (retention by partition drop).
CREATE INDEX job_waiting_idx ON job (id) WHERE state = 'waiting';

-- A child's parents (claim.parents, `brooq job`), and its edges when it is deleted.
CREATE INDEX job_edge_child_idx ON job_edge (child_id);
-- The reaper's safety net looks only at edges not resolved yet.
CREATE INDEX job_edge_open_idx ON job_edge (parent_id) WHERE parent_state IS NULL;

ALTER TABLE job_edge SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100);

-- brooq_job_drop_partition of 0009, knowing workflows: `waiting` is a live state
-- (a partition holding a waiting row waits), a partition holding a parent whose
-- child has not ended waits too (the child may read the parent's result), and
-- the edges of the rows dropped (as children) go with them.
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
        || ' OR EXISTS (SELECT 1 FROM ' || part || ' WHERE state = ''waiting'')'
        || ' OR EXISTS (SELECT 1 FROM ' || part
        || ' WHERE state IN (''done'', ''dead'', ''canceled'') AND updated_at >= now() - $1)'
        INTO busy USING ttl;
    IF NOT busy THEN
        SELECT EXISTS (SELECT 1 FROM job_edge AS e JOIN job AS c ON c.id = e.child_id
                       WHERE (lo IS NULL OR e.parent_id >= lo) AND e.parent_id < hi
                         AND c.state NOT IN ('done', 'dead', 'canceled'))
        INTO busy;
    END IF;
    IF busy THEN
        RETURN NULL;
    END IF;
    DELETE FROM job_key WHERE (lo IS NULL OR job_id >= lo) AND job_id < hi;
    DELETE FROM job_edge WHERE (lo IS NULL OR child_id >= lo) AND child_id < hi;
    EXECUTE 'DROP TABLE ' || part;
    RETURN estimate;
END
$$;
