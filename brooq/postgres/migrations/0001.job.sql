-- The job table: one row per job, the outcome of every attempt written into it.
-- Plain SQL on purpose: it can be pasted into an Alembic or Django migration.

CREATE FUNCTION brooq_uuid7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    -- UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits, so
    -- rows inserted by hand sort in insertion order like the ones brooq writes.
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

CREATE TABLE job (
    id              uuid        PRIMARY KEY DEFAULT brooq_uuid7(),
    topic           text        NOT NULL,
    payload         jsonb       NOT NULL DEFAULT 'null'::jsonb,
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    available_at    timestamptz NOT NULL DEFAULT now(),
    locked_by       text,
    locked_until    timestamptz,
    idempotency_key text,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_state_check
        CHECK (state IN ('pending', 'processing', 'done', 'failed', 'dead', 'canceled')),
    CONSTRAINT job_attempts_check CHECK (attempts >= 0),
    -- Invariant 1: a processing row always has a holder and a lease, set together.
    CONSTRAINT job_processing_lease_check
        CHECK (state <> 'processing' OR (locked_by IS NOT NULL AND locked_until IS NOT NULL)),
    CONSTRAINT job_topic_check CHECK (topic <> '')
);

COMMENT ON TABLE job IS 'brooq jobs: pending -> processing -> done | failed | dead | canceled';
