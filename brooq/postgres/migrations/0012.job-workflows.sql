-- depends: 0010.job-result

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

-- A child's parents (claim.parents, `brooq job`), and its edges when it is deleted.
CREATE INDEX job_edge_child_idx ON job_edge (child_id);
-- The reaper's safety net looks only at edges not resolved yet.
CREATE INDEX job_edge_open_idx ON job_edge (parent_id) WHERE parent_state IS NULL;

ALTER TABLE job_edge SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100);
