-- depends: 0013.job-overrides

-- Paused topics (brooq topics pause): a row per topic that no claimer may start jobs of,
-- on any host, until it is resumed (the row deleted). Jobs of a paused topic are still
-- enqueued, listed, canceled and retried; they wait as `pending` until the resume.
-- Read by every claimer at least every half second (and at once on NOTIFY brooq_pause),
-- so the table is tiny and never on the claim's own path. A topic need not have a kind
-- registered anywhere to be paused (it may be registered later).
CREATE TABLE brooq_topic_pause (
    topic      text        PRIMARY KEY,
    reason     text,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    paused_by  text        NOT NULL DEFAULT current_user,
    CONSTRAINT brooq_topic_pause_topic_check CHECK (char_length(topic) BETWEEN 1 AND 128),
    CONSTRAINT brooq_topic_pause_reason_check CHECK (char_length(reason) <= 500)
);
