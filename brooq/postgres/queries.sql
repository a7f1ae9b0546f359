-- brooq's SQL, all of it. Each statement is named by a `-- name:` line and
-- loaded once by brooq/postgres/sql.py. Parameters are %(name)s placeholders.
-- Every write about an attempt is guarded by state = 'processing', the holder
-- and the attempt number (the fencing token): zero rows means the lease is
-- lost, which is a normal result, never an error.

-- name: enqueue_one
-- One job. ON CONFLICT makes (topic, idempotency_key) idempotent; the caller
-- looks the existing row up when nothing comes back.
WITH inserted AS (
    INSERT INTO job (id, topic, payload, idempotency_key, available_at, priority)
    VALUES (%(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, COALESCE(%(available_at)s, now()),
            %(priority)s)
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, topic
), notified AS (
    SELECT pg_notify('brooq_job', topic) FROM inserted WHERE %(notify)s
)
SELECT id FROM inserted
WHERE (SELECT count(*) FROM notified) >= 0  -- forces the NOTIFY to run

-- name: enqueue_many
-- Many jobs from one JSON array parameter: PostgreSQL parses it faster than
-- the client can adapt six parameter arrays.
WITH inserted AS (
    INSERT INTO job (id, topic, payload, idempotency_key, available_at, priority)
    SELECT id, topic, COALESCE(payload, 'null'::jsonb), key, COALESCE(at, now()), priority
    FROM jsonb_to_recordset(%(jobs)s::jsonb)
         AS input(id uuid, topic text, payload jsonb, key text, at timestamptz, priority smallint)
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, topic
), notified AS (
    SELECT pg_notify('brooq_job', topic) FROM (SELECT DISTINCT topic FROM inserted) t
    WHERE %(notify)s
)
SELECT id FROM inserted
WHERE (SELECT count(*) FROM notified) >= 0  -- forces the NOTIFY to run

-- name: existing_keys
-- The rows that already held the idempotency keys an enqueue did not insert.
SELECT job.topic, job.idempotency_key, job.id
FROM job
JOIN unnest(%(topics)s::text[], %(keys)s::text[]) AS wanted(topic, idempotency_key)
  USING (topic, idempotency_key)

-- name: claim_topic
-- The next ready job of one topic, highest priority first: one scan of
-- job_claim_idx. The attempt is charged here (invariant 6).
UPDATE job
SET state = 'processing', locked_by = %(holder)s, locked_until = now() + %(lease)s,
    attempts = attempts + 1, updated_at = now()
WHERE id = (
    SELECT id FROM job
    WHERE state IN ('pending', 'failed') AND topic = %(topic)s AND available_at <= now()
    ORDER BY priority DESC, available_at, id
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
)
RETURNING id, topic, payload, attempts, locked_until

-- name: claim_topics
-- The next ready job of several topics: the head of each topic's index range
-- (one short scan per topic), then the best of those heads.
UPDATE job
SET state = 'processing', locked_by = %(holder)s, locked_until = now() + %(lease)s,
    attempts = attempts + 1, updated_at = now()
WHERE id = (
    SELECT head.id
    FROM unnest(%(topics)s::text[]) AS served(topic)
    CROSS JOIN LATERAL (
        SELECT id, priority, available_at FROM job
        WHERE state IN ('pending', 'failed') AND topic = served.topic AND available_at <= now()
        ORDER BY priority DESC, available_at, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS head
    ORDER BY head.priority DESC, head.available_at, head.id
    LIMIT 1
)
RETURNING id, topic, payload, attempts, locked_until

-- name: lock_topic
-- Serialize the claims of one topic that has a max_running limit, until the
-- end of the transaction: SKIP LOCKED alone would let two claimers both see
-- room for one more. The claim runs as a separate statement after it, so its
-- snapshot includes every claim committed by the previous lock holder.
SELECT pg_advisory_xact_lock(hashtextextended('brooq.max_running:' || %(topic)s, 0))

-- name: claim_topic_limited
-- claim_topic, only while fewer than max_running jobs of the topic are in flight.
UPDATE job
SET state = 'processing', locked_by = %(holder)s, locked_until = now() + %(lease)s,
    attempts = attempts + 1, updated_at = now()
WHERE id = (
    SELECT id FROM job
    WHERE state IN ('pending', 'failed') AND topic = %(topic)s AND available_at <= now()
      AND (SELECT count(*) FROM job AS running
           WHERE running.state = 'processing' AND running.topic = %(topic)s) < %(max_running)s
    ORDER BY priority DESC, available_at, id
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
)
RETURNING id, topic, payload, attempts, locked_until

-- name: settle
-- Write the outcome of one attempt, if this holder still holds this attempt.
UPDATE job
SET state = %(state)s,
    attempts = GREATEST(attempts - %(refund)s, 0),
    available_at = CASE WHEN %(state)s = 'failed' THEN now() + %(retry_in)s ELSE available_at END,
    last_error = COALESCE(%(error)s, last_error),
    updated_at = now()
WHERE id = %(id)s AND state = 'processing' AND locked_by = %(holder)s AND attempts = %(attempt)s

-- name: settle_and_claim_topic
-- settle, then claim_topic, in one statement and one commit: a busy worker
-- pays one WAL flush per job instead of two. The settled row is 'processing'
-- in the statement's snapshot, so the claim can never take it back.
WITH settled AS (
    UPDATE job
    SET state = %(state)s,
        attempts = GREATEST(attempts - %(refund)s, 0),
        available_at = CASE WHEN %(state)s = 'failed' THEN now() + %(retry_in)s
                            ELSE available_at END,
        last_error = COALESCE(%(error)s, last_error),
        updated_at = now()
    WHERE id = %(id)s AND state = 'processing' AND locked_by = %(holder)s
      AND attempts = %(attempt)s
    RETURNING 1
), claimed AS (
    UPDATE job
    SET state = 'processing', locked_by = %(holder)s, locked_until = now() + %(lease)s,
        attempts = attempts + 1, updated_at = now()
    WHERE id = (
        SELECT id FROM job
        WHERE state IN ('pending', 'failed') AND topic = %(topic)s AND available_at <= now()
        ORDER BY priority DESC, available_at, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    )
    RETURNING id, topic, payload, attempts, locked_until
)
SELECT (SELECT count(*) FROM settled) AS settled,
       claimed.id, claimed.topic, claimed.payload, claimed.attempts, claimed.locked_until
FROM (SELECT 1) AS one LEFT JOIN claimed ON true

-- name: settle_and_claim_topics
-- settle_and_claim_topic for several topics (the claim of claim_topics).
WITH settled AS (
    UPDATE job
    SET state = %(state)s,
        attempts = GREATEST(attempts - %(refund)s, 0),
        available_at = CASE WHEN %(state)s = 'failed' THEN now() + %(retry_in)s
                            ELSE available_at END,
        last_error = COALESCE(%(error)s, last_error),
        updated_at = now()
    WHERE id = %(id)s AND state = 'processing' AND locked_by = %(holder)s
      AND attempts = %(attempt)s
    RETURNING 1
), claimed AS (
    UPDATE job
    SET state = 'processing', locked_by = %(holder)s, locked_until = now() + %(lease)s,
        attempts = attempts + 1, updated_at = now()
    WHERE id = (
        SELECT head.id
        FROM unnest(%(topics)s::text[]) AS served(topic)
        CROSS JOIN LATERAL (
            SELECT id, priority, available_at FROM job
            WHERE state IN ('pending', 'failed') AND topic = served.topic
              AND available_at <= now()
            ORDER BY priority DESC, available_at, id
            LIMIT 1
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS head
        ORDER BY head.priority DESC, head.available_at, head.id
        LIMIT 1
    )
    RETURNING id, topic, payload, attempts, locked_until
)
SELECT (SELECT count(*) FROM settled) AS settled,
       claimed.id, claimed.topic, claimed.payload, claimed.attempts, claimed.locked_until
FROM (SELECT 1) AS one LEFT JOIN claimed ON true

-- name: heartbeat
-- Extend every lease still held, in one statement whatever their number.
UPDATE job
SET locked_until = now() + %(lease)s
FROM unnest(%(ids)s::uuid[], %(holders)s::text[], %(attempts)s::int[])
     AS held(id, holder, attempt)
WHERE job.id = held.id AND job.state = 'processing'
  AND job.locked_by = held.holder AND job.attempts = held.attempt
RETURNING job.id

-- name: release
-- Give jobs back without charging their attempt: the supervisor stopped their
-- handlers (shutdown past its graceful timeout), not the jobs' own fault.
UPDATE job
SET state = 'pending', attempts = GREATEST(attempts - 1, 0), locked_by = NULL,
    locked_until = NULL, available_at = now(), updated_at = now()
FROM unnest(%(ids)s::uuid[], %(holders)s::text[], %(attempts)s::int[])
     AS held(id, holder, attempt)
WHERE job.id = held.id AND job.state = 'processing'
  AND job.locked_by = held.holder AND job.attempts = held.attempt
RETURNING job.id

-- name: requeue_expired
-- The reaper: a lease ran out (the holder's host or supervisor died). Not a
-- failure, so attempts stay as they are; safe to run from many supervisors.
UPDATE job
SET state = 'pending', locked_by = NULL, locked_until = NULL,
    available_at = now(), updated_at = now()
WHERE state = 'processing' AND locked_until < now()
RETURNING topic

-- name: delete_terminal
-- Retention: one batch of terminal rows older than the TTL, oldest first.
DELETE FROM job
WHERE id IN (
    SELECT id FROM job
    WHERE state IN ('done', 'dead', 'canceled') AND updated_at < now() - %(ttl)s
    ORDER BY updated_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
RETURNING topic

-- name: cancel
-- Cancel a job that is not terminal yet; a running handler learns through
-- the NOTIFY (fast) or its next heartbeat (lease lost).
WITH canceled AS (
    UPDATE job
    SET state = 'canceled', updated_at = now(),
        last_error = COALESCE('canceled: ' || %(reason)s, last_error)
    WHERE id = %(id)s AND state IN ('pending', 'failed', 'processing')
    RETURNING id
), notified AS (
    SELECT pg_notify('brooq_cancel', id::text) FROM canceled
)
SELECT id FROM canceled
WHERE (SELECT count(*) FROM notified) >= 0  -- forces the NOTIFY to run

-- name: get
-- The fate of a job: one SELECT.
SELECT id, topic, payload, state, attempts, priority, available_at, locked_by, locked_until,
       idempotency_key, last_error, created_at, updated_at
FROM job
WHERE id = %(id)s

-- name: depth
-- Rows per topic and state.
SELECT topic, state, count(*) AS jobs
FROM job
GROUP BY topic, state
ORDER BY topic, state

-- name: oldest_ready
-- Seconds the oldest ready job of each topic has waited (the queue's lag).
SELECT topic, EXTRACT(EPOCH FROM now() - min(available_at))::float8 AS oldest_ready_s
FROM job
WHERE state IN ('pending', 'failed') AND available_at <= now()
GROUP BY topic
ORDER BY topic

-- name: local_statement_timeout
-- Bound the statements of the current transaction only (SET LOCAL, with a parameter;
-- safe under PgBouncer's transaction mode).
SELECT set_config('statement_timeout', %(timeout)s, true)

-- name: last_scheduled_run
-- When the latest run of a periodic schedule was enqueued (its available_at).
SELECT max(available_at) FROM job
WHERE topic = %(topic)s AND idempotency_key LIKE %(key_prefix)s

-- name: running
-- What is in flight and who holds it.
SELECT id, topic, locked_by, attempts, EXTRACT(EPOCH FROM locked_until - now()) AS lease_left_s
FROM job
WHERE state = 'processing'
ORDER BY locked_until

-- name: recent_dead
SELECT id, topic, attempts, last_error, updated_at
FROM job
WHERE state = 'dead' AND updated_at > now() - %(since)s
ORDER BY updated_at DESC
LIMIT %(limit)s
