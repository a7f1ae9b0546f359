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

-- Fair claiming (fairness="round_robin"): the turns of a fair topic's keys, kept by its
-- claims (claim_topic_fair) under the topic's claim lock. A key's row is when its next turn
-- starts (start-time fair queuing: each job it was given moves it 1/weight on); the topic's
-- clock is where the last claim stood, so a key that comes back after a pause starts at the
-- clock, never with credit for the time it had no job. Key '' is the jobs without one
-- (never a job's rate_key). Rows of keys whose turn the clock has passed are deleted by
-- the claims: they would start at the clock anyway.
CREATE TABLE brooq_fair_turn (
    topic   text    NOT NULL,
    key     text    NOT NULL,
    finish  float8  NOT NULL,
    PRIMARY KEY (topic, key)
);
CREATE TABLE brooq_fair_clock (
    topic   text    PRIMARY KEY,
    clock   float8  NOT NULL
);
