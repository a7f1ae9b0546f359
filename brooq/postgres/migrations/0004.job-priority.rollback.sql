DROP INDEX job_processing_idx;
CREATE INDEX job_processing_idx ON job (locked_until)
    WHERE state = 'processing';

DROP INDEX job_claim_idx;
CREATE INDEX job_claim_idx ON job (topic, available_at, id)
    WHERE state IN ('pending', 'failed');

ALTER TABLE job DROP COLUMN priority;
