ALTER TABLE job DROP COLUMN last_traceback;
