-- The jobs' own overrides and trace contexts go: every job takes its kind's options again.
ALTER TABLE job
    DROP CONSTRAINT job_overrides_check,
    DROP COLUMN max_attempts,
    DROP COLUMN attempt_timeout,
    DROP COLUMN max_execution_timeout,
    DROP COLUMN backoff_base,
    DROP COLUMN backoff_max,
    DROP COLUMN trace_context;
