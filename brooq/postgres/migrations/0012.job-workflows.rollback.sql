-- A waiting job has no state to go back to: refuse, saying what to do.
DO $$
BEGIN
    IF EXISTS (SELECT FROM job WHERE state = 'waiting') THEN
        RAISE EXCEPTION 'jobs are waiting for their parents: let their workflows finish, or '
            'cancel them (brooq jobs cancel --state waiting --topic …), then roll back again';
    END IF;
END
$$;

DROP TABLE job_edge;
DROP INDEX job_workflow_idx;
ALTER TABLE job DROP COLUMN if_parent_fails;
ALTER TABLE job DROP COLUMN parents_left;
ALTER TABLE job DROP COLUMN workflow_id;
ALTER TABLE job DROP CONSTRAINT job_state_check;
ALTER TABLE job ADD CONSTRAINT job_state_check
    CHECK (state IN ('pending', 'processing', 'done', 'failed', 'dead', 'canceled'));
