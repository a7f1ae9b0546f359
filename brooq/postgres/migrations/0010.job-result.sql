-- depends: 0009.job-partitions

-- What the handler returned, as JSON, written in the statement that records
-- `done` (NULL when it returned nothing, and for every other state). It lives
-- in the job's row and leaves with it (queue.result reads it).
ALTER TABLE job ADD COLUMN result jsonb;
