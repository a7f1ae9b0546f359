-- depends: 0001.job

-- Claiming: the ready rows of a topic in order of available_at, then enqueue
-- order (ids are UUIDv7). Partial, so done/dead/canceled rows never weigh on it.
CREATE INDEX job_claim_idx ON job (topic, available_at, id)
    WHERE state IN ('pending', 'failed');

-- Idempotency per (topic, key) for the life of the row; NULL keys never collide.
CREATE UNIQUE INDEX job_idempotency_idx ON job (topic, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Retention walks terminal rows oldest first.
CREATE INDEX job_terminal_idx ON job (updated_at)
    WHERE state IN ('done', 'dead', 'canceled');

-- The reaper and the heartbeat look only at rows in flight.
CREATE INDEX job_processing_idx ON job (locked_until)
    WHERE state = 'processing';
