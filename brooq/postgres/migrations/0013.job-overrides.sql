-- depends: 0012.job-workflows

-- Per-job overrides of the kind's options (Job(max_attempts=…, attempt_timeout=…)):
-- NULL means the kind's option, which lives in code. Checked by brooq when the job is
-- made, as a kind's options are; the constraint guards rows written by hand.
-- trace_context: the W3C trace context of the enqueue (traceparent, tracestate), written
-- by brooq's tracing middleware, read by the worker that runs the job; outside the
-- payload, which stays the application's own. All of them are NULL for most jobs.
-- New columns without a default change only the catalog; the constraint is checked in
-- one pass over the table (every row passes: the columns are new).
ALTER TABLE job
    ADD COLUMN max_attempts integer,
    ADD COLUMN attempt_timeout interval,
    ADD COLUMN max_execution_timeout interval,
    ADD COLUMN backoff_base interval,
    ADD COLUMN backoff_max interval,
    ADD COLUMN trace_context jsonb,
    ADD CONSTRAINT job_overrides_check CHECK (
        (max_attempts IS NULL OR max_attempts BETWEEN 1 AND 1000000)
        AND (attempt_timeout IS NULL
             OR (attempt_timeout > interval '0' AND attempt_timeout <= interval '365 days'))
        AND (max_execution_timeout IS NULL
             OR (max_execution_timeout > interval '0'
                 AND max_execution_timeout <= interval '365 days'))
        AND (backoff_base IS NULL
             OR (backoff_base > interval '0' AND backoff_base <= interval '365 days'))
        AND (backoff_max IS NULL
             OR (backoff_max > interval '0' AND backoff_max <= interval '365 days'))
        AND (trace_context IS NULL OR jsonb_typeof(trace_context) = 'object')
    );
