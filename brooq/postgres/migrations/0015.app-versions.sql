-- depends: 0014.topic-pause

-- App versions (issue 34): during a rolling deploy, old and new supervisors claim from
-- the same table. A job carries the version of the code that enqueued it (NULL: none,
-- every job of an app that sets no version) and a supervisor claims only the jobs of its
-- own version and those with none, so a job enqueued by new code never lands on an old
-- worker. No index: the claim keeps its index scan and filters the version on the rows it
-- reads (rows of another version are few outside a deploy's window; `brooq jobs
-- retarget` moves them).
ALTER TABLE job ADD COLUMN app_version text;
ALTER TABLE job ADD CONSTRAINT job_app_version_check
    CHECK (char_length(app_version) BETWEEN 1 AND 128);

-- Each supervisor's version, for `brooq workers`, `brooq status` and the dashboard.
ALTER TABLE brooq_supervisor ADD COLUMN app_version text;
