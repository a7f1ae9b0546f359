-- depends: 0010.job-result

-- Rate limits (a kind's rate_limit): the starts of a topic's jobs, over every
-- supervisor, never exceed its burst plus its rate times the elapsed time.
-- One row per topic (key '') and per rate_key in use: a token bucket kept as
-- the time it is full again (GCRA), read and written by the claim in its own
-- transaction under the topic's claim lock, with the database's clock.
-- A missing row is a full bucket: rows of keys are deleted once full (idle).
CREATE TABLE brooq_rate_limit (
    topic    text        NOT NULL,
    key      text        NOT NULL DEFAULT '',
    rate     integer     NOT NULL,
    per      interval    NOT NULL,
    burst    integer     NOT NULL,
    full_at  timestamptz NOT NULL,
    PRIMARY KEY (topic, key),
    CONSTRAINT brooq_rate_limit_rate_check CHECK (rate >= 1),
    CONSTRAINT brooq_rate_limit_per_check CHECK (per > interval '0'),
    CONSTRAINT brooq_rate_limit_burst_check CHECK (burst >= 1)
);

-- Job(rate_key=...): the topic's limit applies to each key apart. NULL: the
-- topic's own bucket ('' is kept for it, so a job's key is never '').
ALTER TABLE job ADD COLUMN rate_key text;
ALTER TABLE job ADD CONSTRAINT job_rate_key_check CHECK (rate_key <> '');

-- The claim of a keyed topic walks the distinct keys with claimable rows, then
-- takes the head of each key that has tokens: one short scan per key.
CREATE INDEX job_rate_key_idx ON job (topic, rate_key, priority DESC, available_at, id)
    WHERE state IN ('pending', 'failed') AND rate_key IS NOT NULL;
