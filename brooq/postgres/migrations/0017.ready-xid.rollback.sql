DROP INDEX job_ready_xid_idx;
DROP TRIGGER job_ready_stamp ON job;
DROP FUNCTION brooq_stamp_ready();
ALTER TABLE job DROP COLUMN ready_xid;
