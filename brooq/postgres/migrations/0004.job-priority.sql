-- depends: 0003.job-autovacuum

-- Priorities: higher runs first; equal priorities keep the order of
-- available_at, then enqueue order. The claim index leads with the priority so
-- that claiming stays one index scan.
ALTER TABLE job ADD COLUMN priority smallint NOT NULL DEFAULT 0;

DROP INDEX job_claim_idx;
CREATE INDEX job_claim_idx ON job (topic, priority DESC, available_at, id)
    WHERE state IN ('pending', 'failed');

-- Per-topic concurrency limits count the rows in flight of one topic.
DROP INDEX job_processing_idx;
CREATE INDEX job_processing_idx ON job (topic, locked_until)
    WHERE state = 'processing';
