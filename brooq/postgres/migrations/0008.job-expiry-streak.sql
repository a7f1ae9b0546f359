-- depends: 0006.job-last-traceback

-- Lease expiries since the job's last recorded outcome: the reaper adds one,
-- every settle resets it. QUEUE_MAX_EXPIRATIONS of them in a row mean the job's
-- holder died every time it ran it (the job may be killing its host): dead.
-- `expirations` keeps counting over the job's life (charged = attempts - expirations).
ALTER TABLE job ADD COLUMN expiry_streak integer NOT NULL DEFAULT 0;
ALTER TABLE job ADD CONSTRAINT job_expiry_streak_check
    CHECK (expiry_streak >= 0 AND expiry_streak <= expirations);
