-- depends: 0005.job-expirations

-- The traceback of the last recorded failure, next to last_error (its one-line
-- form); bounded by brooq to 16,000 characters.
ALTER TABLE job ADD COLUMN last_traceback text;
