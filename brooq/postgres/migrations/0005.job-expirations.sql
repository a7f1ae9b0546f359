-- depends: 0004.job-priority

-- Lease expiries, counted by the reaper in the statement that returns the row:
-- an expiry is not a failure (the holder's host or supervisor died), so the
-- attempts that max_attempts bounds are attempts - expirations.
ALTER TABLE job ADD COLUMN expirations integer NOT NULL DEFAULT 0;
ALTER TABLE job ADD CONSTRAINT job_expirations_check
    CHECK (expirations >= 0 AND expirations <= attempts);
