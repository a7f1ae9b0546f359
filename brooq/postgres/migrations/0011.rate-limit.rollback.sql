DROP INDEX job_rate_key_idx;
ALTER TABLE job DROP CONSTRAINT job_rate_key_check;
ALTER TABLE job DROP COLUMN rate_key;
DROP TABLE brooq_rate_limit;
