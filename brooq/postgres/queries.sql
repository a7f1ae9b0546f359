-- brooq's SQL, all of it. Each statement is named by a `-- name:` line and
-- loaded once by brooq/postgres/sql.py. Parameters are %(name)s placeholders.
-- A piece written once and used by several statements is a `-- fragment:`;
-- `{{fragment}}` in a statement is replaced by its text when the file loads.
-- Every write about an attempt is guarded by state = 'processing', the holder
-- and the attempt number (the fencing token): zero rows means the lease is
-- lost, which is a normal result, never an error.

-- fragment: ready
-- A row that may be claimed now. Matches the partial index job_claim_idx.
state IN ('pending', 'failed') AND available_at <= now()

-- fragment: served_version
-- The jobs a claimer of app version %(app_version)s may take: its own and those with none
-- (an unversioned claimer, %(app_version)s NULL, takes only jobs with none). A filter on
-- the rows the claim's index scan reads, never a scan of its own.
(app_version IS NULL OR app_version = %(app_version)s::text)

-- fragment: claim_order
-- Highest priority first, then available_at, then enqueue order (UUIDv7 ids).
priority DESC, available_at, id

-- fragment: claim_set
-- What a claim writes. The attempt is charged here (invariant 6).
state = 'processing', locked_by = %(holder)s, locked_until = now() + %(lease)s,
    attempts = attempts + 1, updated_at = now()

-- fragment: claimed_columns
-- What a claim returns. The payload stays text: it is decoded where the handler runs.
-- Then the job's own overrides of its kind's options and its trace context (NULL for
-- most jobs): the worker and the watchdog apply them.
id, topic, payload::text AS payload, attempts, expirations, locked_until, priority,
    available_at, max_attempts, attempt_timeout, max_execution_timeout, backoff_base,
    backoff_max, trace_context::text AS trace_context

-- fragment: control_columns
-- A job's overrides of its kind's options and the trace context of its enqueue, as an
-- INSERT names them (and an enqueue's JSON input row holds them).
max_attempts, attempt_timeout, max_execution_timeout, backoff_base, backoff_max,
    trace_context

-- fragment: control_params
-- The same, as one job's named parameters.
%(max_attempts)s::int, %(attempt_timeout)s::interval, %(max_execution_timeout)s::interval,
    %(backoff_base)s::interval, %(backoff_max)s::interval, %(trace_context)s::jsonb

-- fragment: controls_input
-- The types of control_columns in an enqueue's JSON input (absent fields are NULL).
max_attempts int, attempt_timeout interval, max_execution_timeout interval,
    backoff_base interval, backoff_max interval, trace_context jsonb

-- fragment: held
-- The fence of every write about one attempt: still processing, same holder, same attempt.
state = 'processing' AND locked_by = %(holder)s AND attempts = %(attempt)s

-- fragment: held_by_tickets
-- The fence for many attempts at once, given as three arrays. Its state test is written
-- `(…) IS TRUE` so that no plan can read the rows through job_processing_idx (partial on
-- that state) instead of by id: the statistics say few rows are processing, but while a
-- session holds a snapshot open that index keeps an entry for every job settled since,
-- and a statement reading it would walk them all (docs/architecture.md, "Claims from
-- floors"). settle_many's fence is written the same way.
FROM unnest(%(ids)s::uuid[], %(holders)s::text[], %(attempts)s::int[])
     AS held(id, holder, attempt)
WHERE job.id = held.id AND (job.state = 'processing') IS TRUE
  AND job.locked_by = held.holder AND job.attempts = held.attempt

-- fragment: notify_ended
-- One NOTIFY brooq_done for a statement that ended jobs (done, dead, canceled):
-- whoever waits for a result (queue.result) looks again. One per statement,
-- never one per job.
SELECT pg_notify('brooq_done', '') FROM settled
WHERE state IN ('done', 'dead', 'canceled') LIMIT 1

-- fragment: notify_forced
-- A CTE nobody selects from is not run: counting its rows forces the NOTIFY.
WHERE (SELECT count(*) FROM notified) >= 0

-- fragment: resolve_children
-- Workflows: the edges of the jobs a statement ended, resolved in that statement (so in
-- the transaction that records their outcome). The statement names those jobs first, as
-- `ended (id, state)`: done, dead or canceled (missing: a parent gone, from the reaper's
-- safety net; other states resolve nothing). Then:
-- doomed: the waiting children with if_parent_fails = 'cancel' of a parent that failed,
--   and theirs, transitively: they are canceled here, so their own edges end here too;
-- resolved: each edge still open from those parents gets the parent's end (an edge moves
--   from NULL once: its row lock and the re-checked `parent_state IS NULL` make this
--   statement the only one that resolves it);
-- tally: per child, how many of its edges this statement resolved, and the first parent
--   (by id) that failed, named in the reason of a cancel;
-- locked: those children, locked in id order (two statements resolving edges of the same
--   children never wait for each other in a cycle), read as they are now (a lock waits
--   for a concurrent resolver to commit, then returns the row it wrote);
-- fate: what each becomes: its counter of parents left less what was resolved here; a
--   waiting child whose last parent ended becomes pending (canceled when one failed and
--   its policy is cancel); a child in any other state keeps it (the counter still moves,
--   and taking the lock is what serializes a concurrent retry of it);
-- released: the children written, and woken: one NOTIFY brooq_job per topic with a child
--   made pending (workers claim it at once), brooq_done when one was canceled.
-- Rows of `ended` are never children here: one statement cannot update a row twice.
doomed (id) AS (
    SELECT e.child_id
    FROM ended
    JOIN job_edge AS e ON e.parent_id = ended.id AND e.parent_state IS NULL
    JOIN job AS c ON c.id = e.child_id AND c.state = 'waiting' AND c.if_parent_fails = 'cancel'
    WHERE ended.state IN ('dead', 'canceled', 'missing')
      AND e.child_id NOT IN (SELECT id FROM ended)
    UNION
    SELECT e.child_id
    FROM doomed
    JOIN job_edge AS e ON e.parent_id = doomed.id AND e.parent_state IS NULL
    JOIN job AS c ON c.id = e.child_id AND c.state = 'waiting' AND c.if_parent_fails = 'cancel'
    WHERE e.child_id NOT IN (SELECT id FROM ended)
), ending (id, state) AS (
    SELECT id, state FROM ended WHERE state IN ('done', 'dead', 'canceled', 'missing')
    UNION ALL
    SELECT id, 'canceled' FROM doomed
), resolved AS (
    UPDATE job_edge AS e
    SET parent_state = ending.state
    FROM ending
    WHERE e.parent_id = ending.id AND e.parent_state IS NULL
    RETURNING e.parent_id, e.child_id, e.parent_state
), tally AS (
    SELECT child_id, count(*) AS ended,
           (array_agg('canceled: parent ' || parent_id
                      || CASE WHEN parent_state = 'missing' THEN ' does not exist'
                              ELSE ' ended ' || parent_state END
                      ORDER BY parent_id) FILTER (WHERE parent_state <> 'done'))[1] AS reason
    FROM resolved
    WHERE child_id NOT IN (SELECT id FROM ended)
    GROUP BY child_id
), locked AS (
    SELECT c.id, c.state, c.parents_left, c.if_parent_fails
    FROM job AS c
    WHERE c.id IN (SELECT child_id FROM tally)
    ORDER BY c.id
    FOR NO KEY UPDATE
), fate AS (
    SELECT l.id, l.parents_left - t.ended AS parents_left, t.reason,
           l.state = 'waiting' AS was_waiting,
           CASE WHEN l.state <> 'waiting' THEN l.state
                WHEN t.reason IS NOT NULL AND l.if_parent_fails = 'cancel' THEN 'canceled'
                WHEN l.parents_left - t.ended > 0 THEN 'waiting'
                ELSE 'pending' END AS state
    FROM locked AS l JOIN tally AS t ON t.child_id = l.id
), released AS (
    UPDATE job AS child
    SET parents_left = fate.parents_left,
        state = fate.state,
        last_error = CASE WHEN fate.was_waiting AND fate.state = 'canceled'
                          THEN fate.reason ELSE child.last_error END,
        available_at = CASE WHEN fate.was_waiting AND fate.state = 'pending'
                            THEN GREATEST(child.available_at, now()) ELSE child.available_at END,
        updated_at = CASE WHEN fate.was_waiting AND fate.state <> 'waiting'
                          THEN now() ELSE child.updated_at END
    FROM fate
    WHERE child.id = fate.id
    RETURNING child.id, child.topic, child.state,
              fate.was_waiting AND fate.state <> 'waiting' AS woke
), woken AS (
    SELECT pg_notify('brooq_job', topic)
    FROM (SELECT DISTINCT topic FROM released WHERE woke AND state = 'pending') AS t
    UNION ALL
    SELECT pg_notify('brooq_done', '')
    FROM (SELECT FROM released WHERE woke AND state = 'canceled' LIMIT 1) AS t
)

-- fragment: resolve_forced
-- Forces the NOTIFYs of resolve_children (its writes run whether read or not).
(SELECT count(*) FROM woken) >= 0

-- fragment: waited_for
-- A row that a child not ended yet was enqueued after: the child may still read it
-- (claim.parents), so retention and purge leave it. The child's state is read by id (a
-- subquery per edge: one probe of the child's partition, never a scan of job).
EXISTS (SELECT FROM job_edge AS e
        WHERE e.parent_id = job.id
          AND (SELECT c.state FROM job AS c WHERE c.id = e.child_id)
              NOT IN ('done', 'dead', 'canceled'))

-- fragment: edges_gone
-- The edges of deleted rows (a `gone` CTE) leave with them; a parent's edges stay while
-- its child is there, so the child still lists it (as gone).
edges_gone AS (
    DELETE FROM job_edge WHERE child_id IN (SELECT id FROM gone)
)

-- fragment: held_keys
-- The rows of `wanted` (topic, idempotency_key) whose key a job holds: that job's id and
-- state. A state NULL is a key whose job is gone without it (a row deleted by hand).
SELECT held.job_id, false AS created, held.topic, held.idempotency_key, job.state
FROM job_key AS held
LEFT JOIN job ON job.id = held.job_id

-- name: enqueue_one
-- One job. Its key goes into job_key first (ON CONFLICT: a key is held once); the job is
-- inserted only when it has no key or its key went in. A key held before this statement
-- comes back with its job's id and state; one taken by a transaction that committed
-- meanwhile comes back from nowhere here, and the caller asks again (existing_keys).
WITH keyed AS (
    INSERT INTO job_key (topic, idempotency_key, job_id)
    SELECT %(topic)s::text, %(key)s::text, %(id)s::uuid WHERE %(key)s::text IS NOT NULL
    ON CONFLICT (topic, idempotency_key) DO NOTHING
    RETURNING job_id
), inserted AS (
    INSERT INTO job (id, topic, payload, idempotency_key, available_at, priority, rate_key,
                     app_version, {{control_columns}})
    SELECT %(id)s::uuid, %(topic)s::text, %(payload)s::jsonb, %(key)s::text,
           COALESCE(%(available_at)s::timestamptz, now()), %(priority)s::smallint,
           %(rate_key)s::text, %(app_version)s::text, {{control_params}}
    WHERE %(key)s::text IS NULL OR EXISTS (SELECT FROM keyed)
    RETURNING id, topic
), notified AS (
    SELECT pg_notify('brooq_job', topic) FROM inserted WHERE %(notify)s
)
SELECT id, true AS created, NULL::text, NULL::text, NULL::text FROM inserted
{{notify_forced}}
UNION ALL
{{held_keys}}
WHERE held.topic = %(topic)s::text AND held.idempotency_key = %(key)s::text
  AND NOT EXISTS (SELECT FROM keyed)

-- name: enqueue_many
-- Many jobs from one JSON array parameter (PostgreSQL parses it faster than the client
-- can adapt six parameter arrays), keyed as enqueue_one keys one.
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(jobs)s::jsonb)
        AS input(id uuid, topic text, payload jsonb, key text, at timestamptz, priority smallint,
                 rate_key text, {{controls_input}})
), keyed AS (
    INSERT INTO job_key (topic, idempotency_key, job_id)
    SELECT topic, key, id FROM input WHERE key IS NOT NULL
    ON CONFLICT (topic, idempotency_key) DO NOTHING
    RETURNING job_id
), inserted AS (
    INSERT INTO job (id, topic, payload, idempotency_key, available_at, priority, rate_key,
                     app_version, {{control_columns}})
    SELECT id, topic, COALESCE(payload, 'null'::jsonb), key, COALESCE(at, now()), priority,
           rate_key, %(app_version)s::text, {{control_columns}}
    FROM input
    WHERE key IS NULL OR id IN (SELECT job_id FROM keyed)
    RETURNING id, topic
), notified AS (
    SELECT pg_notify('brooq_job', topic) FROM (SELECT DISTINCT topic FROM inserted) t
    WHERE %(notify)s
)
SELECT id, true AS created, NULL::text, NULL::text, NULL::text FROM inserted
{{notify_forced}}
UNION ALL
{{held_keys}}
JOIN (SELECT DISTINCT topic, key FROM input
      WHERE key IS NOT NULL AND id NOT IN (SELECT job_id FROM keyed)) AS wanted
  ON held.topic = wanted.topic AND held.idempotency_key = wanted.key

-- name: enqueue_one_keyless
-- One job without an idempotency key: nothing to look up, so nothing read from job (a
-- statement that reads the partitioned job would lock every partition of it each time).
-- Ids come back as text: what the caller keeps, without parsing a uuid for each.
WITH inserted AS (
    INSERT INTO job (id, topic, payload, available_at, priority, rate_key, app_version,
                     {{control_columns}})
    VALUES (%(id)s::uuid, %(topic)s::text, %(payload)s::jsonb,
            COALESCE(%(available_at)s::timestamptz, now()), %(priority)s::smallint,
            %(rate_key)s::text, %(app_version)s::text, {{control_params}})
    RETURNING id, topic
), notified AS (
    SELECT pg_notify('brooq_job', topic) FROM inserted WHERE %(notify)s
)
SELECT id::text, true AS created, NULL::text, NULL::text, NULL::text FROM inserted
{{notify_forced}}

-- name: enqueue_many_keyless
-- Many jobs without idempotency keys, from one JSON array as enqueue_many: no key to write
-- or look up.
WITH inserted AS (
    INSERT INTO job (id, topic, payload, available_at, priority, rate_key, app_version,
                     {{control_columns}})
    SELECT id, topic, COALESCE(payload, 'null'::jsonb), COALESCE(at, now()), priority, rate_key,
           %(app_version)s::text, {{control_columns}}
    FROM jsonb_to_recordset(%(jobs)s::jsonb)
        AS input(id uuid, topic text, payload jsonb, at timestamptz, priority smallint,
                 rate_key text, {{controls_input}})
    RETURNING id, topic
), notified AS (
    SELECT pg_notify('brooq_job', topic) FROM (SELECT DISTINCT topic FROM inserted) t
    WHERE %(notify)s
)
SELECT id::text, true AS created, NULL::text, NULL::text, NULL::text FROM inserted
{{notify_forced}}

-- name: copy_jobs
-- A keyless batch streamed in COPY's text format (brooq.postgres.bulk): the columns named,
-- so every other one takes its default (state, times, available_at = now()).
COPY job (id, payload, topic, priority, rate_key, app_version) FROM STDIN

-- name: copy_jobs_plain
-- copy_jobs for jobs that set only their topic and payload, enqueued without an app
-- version: priority, rate_key and app_version take their defaults (0, NULL, NULL), the
-- values copy_jobs would send.
COPY job (id, payload, topic) FROM STDIN

-- name: copy_jobs_at
-- copy_jobs for jobs that carry their own available_at.
COPY job (id, payload, topic, priority, rate_key, app_version, available_at) FROM STDIN

-- name: notify_topics
-- The NOTIFYs of a batch written with COPY (which returns nothing to notify from): one
-- per topic, sent when its transaction commits, as the enqueue statements' are.
SELECT pg_notify('brooq_job', topic) FROM unnest(%(topics)s::text[]) AS topic

-- name: existing_keys
-- The jobs holding idempotency keys an enqueue did not insert, read anew (a statement of
-- its own sees the keys of transactions that committed after the enqueue's began).
{{held_keys}}
JOIN unnest(%(topics)s::text[], %(keys)s::text[]) AS wanted(topic, idempotency_key)
  ON held.topic = wanted.topic AND held.idempotency_key = wanted.idempotency_key

-- name: free_orphan_keys
-- Keys whose job is gone without them (a row deleted by hand, not by brooq): the key is
-- free again, as it would be had the row left through brooq.
DELETE FROM job_key AS held
USING unnest(%(topics)s::text[], %(keys)s::text[]) AS wanted(topic, idempotency_key)
WHERE held.topic = wanted.topic AND held.idempotency_key = wanted.idempotency_key
  AND NOT EXISTS (SELECT FROM job WHERE job.id = held.job_id)

-- name: claim_topic
-- Up to `limit` ready jobs of one topic: one scan of job_claim_idx in each partition,
-- merged in claim order. The rows are joined back by id (not `id = ANY(…)`, which no
-- partition bound can prune), so each row's update reads the one partition that holds it;
-- unnest() keeps the planner's guess at a few rows, so even a generic plan (a LIMIT it
-- cannot see) joins by the primary key.
UPDATE job
SET {{claim_set}}
FROM unnest(ARRAY(
    SELECT id FROM job
    WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
    ORDER BY {{claim_order}}
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)) AS picked (job_id)
WHERE job.id = picked.job_id
RETURNING {{claimed_columns}}

-- name: claim_topics
-- Up to `limit` ready jobs of several topics: the head of each topic's index
-- range (one short scan per topic), then the best of those heads. Rows locked
-- by a head but not chosen are unlocked when the statement ends.
UPDATE job
SET {{claim_set}}
FROM unnest(ARRAY(
    SELECT head.id
    FROM unnest(%(topics)s::text[]) AS served(topic)
    CROSS JOIN LATERAL (
        SELECT id, priority, available_at FROM job
        WHERE {{ready}} AND {{served_version}} AND topic = served.topic
        ORDER BY {{claim_order}}
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS head
    ORDER BY head.priority DESC, head.available_at, head.id
    LIMIT %(limit)s
)) AS picked (job_id)
WHERE job.id = picked.job_id
RETURNING {{claimed_columns}}

-- name: claim_levels
-- Where a claimer of one topic begins (brooq/postgres/floors.py): the priority levels of
-- its ready and scheduled jobs, highest first (a loose scan of job_claim_idx, one descent
-- a level), and the snapshot they were read in. The one claim statement of a claimer that
-- reads a level from its start: rows made ready after this snapshot are found fresh.
WITH RECURSIVE level AS (
    (SELECT priority FROM job
     WHERE topic = %(topic)s AND state IN ('pending', 'failed')
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT priority FROM job
            WHERE topic = %(topic)s AND state IN ('pending', 'failed')
              AND priority < level.priority
            ORDER BY priority DESC LIMIT 1)
    FROM level WHERE level.priority IS NOT NULL
)
SELECT pg_current_snapshot()::text AS seen,
       ARRAY(SELECT priority FROM level WHERE priority IS NOT NULL) AS levels

-- name: claim_floors
-- claim_topics, from floors (brooq/postgres/floors.py). Each priority level of each topic
-- is read from its floor on, the place after which its claimer has claimed nothing (one
-- index range of job_claim_idx: `priority = level AND (available_at, id) > floor`), so no
-- index entry of a row claimed before is walked again; then the best of those heads. Rows
-- a head locked but the LIMIT left out are unlocked when the statement ends.
-- First, the look for rows made ready behind a floor: a topic's rows made ready (inserted,
-- or stamped by job_ready_stamp) since its claimer's previous look, committed now and not
-- visible in the snapshot `seen` it looked with (PgQ's rule), in the partitions of the
-- last ten minutes' ids (where inserts land: a few index descents, not one a partition)
-- unless `everywhere` (a sweep); the earliest place of each level among them moves that
-- level's floor back (or adds the level). The range on
-- ready_xid starts at the oldest transaction `seen` did not see that has ended since (else
-- at its xmax): a transaction still open, however old (idle in a transaction), holds
-- nothing back.
-- Returns the claimed rows (claimed_columns), then one row per topic and fresh level with
-- a NULL id: topic, this look's snapshot (as payload), level (priority), earliest place
-- (available_at); level NULL when the topic has no fresh row.
WITH fresh AS MATERIALIZED (
    SELECT look.topic, f.priority, f.at, pg_current_snapshot()::text AS seen
    FROM unnest(%(topics)s::text[], %(seen)s::text[]) AS look (topic, seen)
    LEFT JOIN LATERAL (
        SELECT priority, min(available_at) AS at
        FROM job
        WHERE topic = look.topic
          -- job_ready_xid_idx's predicate, then the waiting rows out: job_claim_idx's
          -- predicate is not implied, so no plan reads the fresh rows through it.
          AND state IN ('pending', 'failed', 'waiting') AND state <> 'waiting'
          AND id >= CASE WHEN %(everywhere)s::bool THEN '00000000-0000-0000-0000-000000000000'::uuid
                         ELSE brooq_job_bound(now() - interval '10 minutes') END
          AND ready_xid >= (
              SELECT min(x) FROM (
                  SELECT pg_snapshot_xmax(look.seen::pg_snapshot) AS x
                  UNION ALL
                  SELECT open.x FROM pg_snapshot_xip(look.seen::pg_snapshot) AS open (x)
                  WHERE open.x <> ALL (ARRAY(SELECT pg_snapshot_xip(pg_current_snapshot())))
              ) AS unseen)
          AND ready_xid < pg_snapshot_xmax(pg_current_snapshot())
          AND NOT pg_visible_in_snapshot(ready_xid, look.seen::pg_snapshot)
        GROUP BY priority
    ) AS f ON true
), floor AS (
    SELECT coalesce(kept.topic, fresh.topic) AS topic,
           coalesce(kept.priority, fresh.priority) AS priority,
           CASE WHEN kept.at IS NULL OR fresh.at <= kept.at THEN fresh.at ELSE kept.at END AS at,
           CASE WHEN kept.at IS NULL OR fresh.at <= kept.at
                THEN '00000000-0000-0000-0000-000000000000'::uuid ELSE kept.id END AS id
    FROM unnest(%(floor_topics)s::text[], %(levels)s::smallint[], %(ats)s::timestamptz[],
                %(ids)s::uuid[]) AS kept (topic, priority, at, id)
    FULL JOIN (SELECT * FROM fresh WHERE priority IS NOT NULL) AS fresh
        ON fresh.topic = kept.topic AND fresh.priority = kept.priority
), claimed AS (
    UPDATE job
    SET {{claim_set}}
    FROM unnest(ARRAY(
        SELECT head.id
        FROM floor
        CROSS JOIN LATERAL (
            SELECT id, priority, available_at FROM job
            WHERE {{ready}} AND {{served_version}} AND topic = floor.topic
              AND priority = floor.priority AND (available_at, id) > (floor.at, floor.id)
            ORDER BY available_at, id
            LIMIT %(limit)s
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS head
        ORDER BY head.priority DESC, head.available_at, head.id
        LIMIT %(limit)s
    )) AS picked (job_id)
    WHERE job.id = picked.job_id
    RETURNING {{claimed_columns}}
)
SELECT * FROM claimed
UNION ALL
SELECT NULL, topic, seen, NULL, NULL, NULL, priority, at, NULL, NULL, NULL, NULL, NULL, NULL
FROM fresh

-- name: lock_topic
-- Serialize the claims of one topic that has a max_running or a rate limit,
-- until the end of the transaction: SKIP LOCKED alone would let two claimers
-- both see room for one more (or both spend the same token). The claim runs as
-- a separate statement after it, so its snapshot includes every claim
-- committed by the previous lock holder. Its statements are planned for their
-- parameters (plan_cache_mode auto for this transaction, even on a claims lane whose
-- session runs generic plans): the rated claim's plan depends on them.
SELECT pg_advisory_xact_lock(hashtextextended('brooq.max_running:' || %(topic)s, 0)),
       set_config('plan_cache_mode', 'auto', true)

-- name: lock_fair_topic
-- lock_topic (the same lock), for a claim of a fair topic: and, for this transaction only,
-- its statements run on a generic plan. fair_walk names many partitions' indexes several
-- times: planning it takes ten times what running it does (3.5 ms against 0.3 ms on 10,000
-- keys), and with a LIMIT of unknown size the planner keeps choosing custom plans; a
-- prepared generic plan is the same index probes, planned once per connection (psycopg
-- prepares a statement at its fifth run; through PgBouncer nothing is prepared).
SELECT pg_advisory_xact_lock(hashtextextended('brooq.max_running:' || %(topic)s, 0)),
       set_config('plan_cache_mode', 'force_generic_plan', true)

-- name: claim_topic_limited
-- claim_topic, at most as many as the topic's max_running leaves room for.
UPDATE job
SET {{claim_set}}
FROM unnest(ARRAY(
    SELECT id FROM job
    WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
    ORDER BY {{claim_order}}
    LIMIT GREATEST(0, LEAST(%(limit)s, %(max_running)s - (
        SELECT count(*) FROM job AS running
        WHERE running.state = 'processing' AND running.topic = %(topic)s)))
    FOR NO KEY UPDATE SKIP LOCKED
)) AS picked (job_id)
WHERE job.id = picked.job_id
RETURNING {{claimed_columns}}

-- fragment: fair_weights
-- The weights of a fair topic's keys (jobs per turn); a key not named weighs 1.
fair_weights AS (
    SELECT key, weight FROM unnest(%(fair_keys)s::text[], %(fair_weights)s::int[]) AS w(key, weight)
)

-- fragment: fair_place
-- A candidate row's place among its key's candidates, from 0, in claim order.
(row_number() OVER (ORDER BY priority DESC, available_at, id) - 1)::int

-- fragment: running_room
-- How many more of the topic's jobs may start under its max_running (NULL: no cap).
CASE WHEN %(max_running)s::int IS NULL THEN %(limit)s
     ELSE GREATEST(0, LEAST(%(limit)s, %(max_running)s::int - (
         SELECT count(*) FROM job AS running
         WHERE running.state = 'processing' AND running.topic = %(topic)s)))
END

-- fragment: fair_turn
-- A rate-limited claim's candidate row (at `place` among its key's rows read, turn_of as t)
-- in the turns of a fair topic: its round, its key's segment of the rotation and its base
-- (brooq/engine/rotation.py); NULLs on a topic that is not fair (no turn_of row).
CASE WHEN head.place < t.weight - t.base THEN 0
     ELSE 1 + (head.place - (t.weight - t.base)) / t.weight END AS round,
    t.seg, CASE WHEN head.place < t.weight - t.base THEN t.base ELSE 0 END AS base

-- fragment: fair_cursor
-- A fair topic's cursor (brooq_fair_cursor): the key served last and the jobs it took in its
-- turn, and whether that turn goes on (jobs left in it: the key's weight, 1 unless named).
-- A topic without a row starts as if the turn of '' (jobs without a key) were used up, so
-- its first claim starts at the first key. brooq/engine/rotation.py's Cursor is the same.
fair_cursor AS MATERIALIZED (
    SELECT COALESCE(c.key, '') AS key, COALESCE(c.used, %(most_weight)s) AS used,
           COALESCE(c.used, %(most_weight)s) < COALESCE(w.weight, 1) AS continues
    FROM (SELECT) AS one
    LEFT JOIN brooq_fair_cursor AS c ON c.topic = %(topic)s
    LEFT JOIN fair_weights AS w ON w.key = COALESCE(c.key, '')
)

-- fragment: fair_key_rows
-- One key's ready rows at the claim's priority (`level`), in claim order, on job_rate_key_idx
-- (topic, rate_key, priority DESC, available_at, id): a range of the index.
SELECT id FROM job
WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s AND priority = level.priority

-- fragment: fair_unkeyed
-- The jobs without a key at the claim's priority, numbered from 0: among the topic's first
-- `unkeyed_window` ready rows of that priority on job_claim_idx, so a fair topic whose jobs
-- all have keys is never read whole for none.
fair_unkeyed AS MATERIALIZED (
    SELECT id, (row_number() OVER (ORDER BY available_at, id) - 1)::int AS place
    FROM (SELECT id, available_at, rate_key FROM job
          WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
            AND priority = (SELECT priority FROM level)
          ORDER BY {{claim_order}}
          LIMIT %(unkeyed_window)s) AS window_rows
    WHERE rate_key IS NULL
)

-- name: fair_walk
-- The first read of a claim of a fair topic (fairness="round_robin"), run after lock_topic in
-- the same transaction, so it sees the cursor and the rows every claim before it committed
-- on any host. The claim takes the topic's highest ready priority (`level`); within it the
-- keys take turns in key order from the cursor (brooq/engine/rotation.py): the cursor's key
-- first while its turn goes on, then the keys after it, then '' (jobs without a key), then
-- those before it, then the cursor's key when its turn is used up. Every key gives at least
-- one job in round 0, so a claim of `limit` jobs needs at most `limit` keys of that
-- rotation: the walk visits no more (one probe each on job_rate_key_idx), however many keys
-- have ready jobs. Each key then reads only what the claim can take from it: when the walk
-- was cut at `limit` keys, its round-0 jobs and never more than `limit - idx` (the keys
-- before it give one job each first); when it went round every key, enough rounds for
-- `limit` jobs had every key jobs to spare (limited.py reads more while keys ran short).
-- Returns each row read (in no order): its key, the key's place in the rotation (idx), the
-- rows asked of the key, the row's place among the key's rows; and, on every row, the priority, the
-- cursor and how many keys the walk visited. No row: nothing is ready.
WITH RECURSIVE {{fair_weights}}, {{fair_cursor}}, level AS MATERIALIZED (
    SELECT priority FROM job
    WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
    ORDER BY {{claim_order}}
    LIMIT 1
), {{fair_unkeyed}}, ahead AS (
    -- The keys after the cursor's, in key order: one short probe each (a loose index scan).
    (SELECT rate_key FROM job
     WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
       AND priority = (SELECT priority FROM level) AND rate_key > (SELECT key FROM fair_cursor)
     ORDER BY rate_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT next.rate_key FROM job AS next
            WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
              AND priority = (SELECT priority FROM level) AND next.rate_key > ahead.rate_key
            ORDER BY next.rate_key
            LIMIT 1)
    FROM ahead
    WHERE ahead.rate_key IS NOT NULL
), behind AS (
    -- The keys before the cursor's, from the first (read only once `ahead` ran out).
    (SELECT rate_key FROM job
     WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
       AND priority = (SELECT priority FROM level) AND rate_key < (SELECT key FROM fair_cursor)
     ORDER BY rate_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT next.rate_key FROM job AS next
            WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
              AND priority = (SELECT priority FROM level) AND next.rate_key > behind.rate_key
              AND next.rate_key < (SELECT key FROM fair_cursor)
            ORDER BY next.rate_key
            LIMIT 1)
    FROM behind
    WHERE behind.rate_key IS NOT NULL
), own AS MATERIALIZED (
    -- Whether the cursor's own key has ready rows at this priority.
    SELECT c.key FROM fair_cursor AS c
    WHERE CASE WHEN c.key = '' THEN EXISTS (SELECT FROM fair_unkeyed)
               ELSE EXISTS (SELECT FROM job
                            WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
                              AND priority = (SELECT priority FROM level) AND rate_key = c.key)
          END
), walk AS MATERIALIZED (
    -- Lazily: the walk stops after `limit` keys (Append reads its parts in order).
    SELECT rotation.key, (row_number() OVER () - 1)::int AS idx
    FROM (SELECT own.key FROM own, fair_cursor WHERE fair_cursor.continues
          UNION ALL
          SELECT rate_key FROM ahead WHERE rate_key IS NOT NULL
          UNION ALL
          SELECT '' FROM fair_cursor WHERE key <> '' AND EXISTS (SELECT FROM fair_unkeyed)
          UNION ALL
          SELECT rate_key FROM behind WHERE rate_key IS NOT NULL
          UNION ALL
          SELECT own.key FROM own, fair_cursor WHERE NOT fair_cursor.continues
          LIMIT %(limit)s) AS rotation (key)
), quotas AS MATERIALIZED (
    -- Each key's weight and its round-0 jobs (the cursor's key: what is left of its turn).
    SELECT walk.key, walk.idx, COALESCE(w.weight, 1) AS weight,
           COALESCE(w.weight, 1) - CASE WHEN walk.idx = 0 AND walk.key = c.key AND c.continues
                                        THEN c.used ELSE 0 END AS first
    FROM walk
    CROSS JOIN fair_cursor AS c
    LEFT JOIN fair_weights AS w ON w.key = walk.key
), asked AS MATERIALIZED (
    SELECT q.key, q.idx,
           CASE WHEN t.keys >= %(limit)s THEN LEAST(q.first, %(limit)s - q.idx)
                ELSE LEAST(%(limit)s, q.first + t.rounds * q.weight)
           END AS rows,
           t.keys
    FROM quotas AS q
    CROSS JOIN (SELECT count(*) AS keys,
                       ceil(GREATEST(0, %(limit)s - sum(first))::numeric / sum(weight))::int
                           AS rounds
                FROM quotas) AS t
)
SELECT a.key, a.idx, a.rows, read.place, read.id, level.priority, c.key, c.used, a.keys
FROM asked AS a
CROSS JOIN level
CROSS JOIN fair_cursor AS c
CROSS JOIN LATERAL (
    SELECT keyed.id, (row_number() OVER () - 1)::int AS place
    FROM ({{fair_key_rows}} AND rate_key = a.key
          ORDER BY {{claim_order}}
          LIMIT a.rows) AS keyed
    WHERE a.key <> ''
    UNION ALL
    SELECT u.id, u.place FROM fair_unkeyed AS u WHERE a.key = '' AND u.place < a.rows
) AS read

-- name: fair_more
-- More rows of some keys of a fair claim's walk (fair_walk went round every key and some ran
-- short, so the others give more rounds): each key's rows at the claim's priority after the
-- first `skip`, at most `take`; in the same transaction, so the same rows as the walk saw.
WITH level AS MATERIALIZED (
    SELECT %(priority)s::smallint AS priority
), {{fair_unkeyed}}
SELECT more.key, read.place, read.id
FROM unnest(%(keys)s::text[], %(skips)s::int[], %(takes)s::int[]) AS more (key, skip, take)
CROSS JOIN level
CROSS JOIN LATERAL (
    SELECT keyed.id, (more.skip + row_number() OVER () - 1)::int AS place
    FROM ({{fair_key_rows}} AND rate_key = more.key
          ORDER BY {{claim_order}}
          OFFSET more.skip
          LIMIT more.take) AS keyed
    WHERE more.key <> ''
    UNION ALL
    SELECT u.id, u.place FROM fair_unkeyed AS u
    WHERE more.key = '' AND u.place >= more.skip AND u.place < more.skip + more.take
) AS read

-- name: claim_fair_turns
-- The jobs a fair claim chose (limited.py, in the order of the turns, each with its key, its
-- round and its key's base, brooq/engine/rotation.py), as many as max_running leaves room
-- for; run after fair_walk in its transaction. Only these rows are locked (SKIP LOCKED, the
-- ready state and the version checked again on each row as it is now: read committed
-- re-checks an updated row), and the cursor moves to the last one claimed: its key, and the
-- jobs that key has taken in its turn. A row locked by someone else (an operator's cancel)
-- is skipped and its key's turn is not charged for it.
WITH chosen AS MATERIALIZED (
    SELECT c.id, c.key, c.round, c.base, c.seq
    FROM unnest(%(ids)s::uuid[], %(keys)s::text[], %(rounds)s::int[], %(bases)s::int[])
         WITH ORDINALITY AS c (id, key, round, base, seq)
    ORDER BY c.seq
    LIMIT {{running_room}}
), locked AS MATERIALIZED (
    SELECT chosen.* FROM job
    JOIN chosen ON job.id = chosen.id
    WHERE job.state IN ('pending', 'failed') AND job.available_at <= now()
      AND (job.app_version IS NULL OR job.app_version = %(app_version)s::text)
    FOR NO KEY UPDATE OF job SKIP LOCKED
), last AS (
    SELECT key, round, base FROM locked ORDER BY seq DESC LIMIT 1
), turned AS (
    INSERT INTO brooq_fair_cursor AS c (topic, key, used)
    SELECT %(topic)s, last.key,
           last.base + (SELECT count(*) FROM locked
                        WHERE locked.key = last.key AND locked.round = last.round)
    FROM last
    ON CONFLICT (topic) DO UPDATE SET key = EXCLUDED.key, used = EXCLUDED.used
)
UPDATE job
SET {{claim_set}}
FROM unnest(ARRAY(SELECT id FROM locked)) AS picked (job_id)
WHERE job.id = picked.job_id
RETURNING {{claimed_columns}}

-- fragment: bucket_deficit_us
-- How far a bucket is from full, in whole microseconds of the database clock
-- (0 for a missing row: a missing bucket is full).
GREATEST(0, EXTRACT(EPOCH FROM bucket.full_at - clock.t) * 1000000)

-- name: claim_topic_rated
-- claim_topic within the topic's rate limit (and its max_running, when it has
-- one), run after lock_topic in the same transaction: the buckets read here
-- include every claim committed by the previous lock holder, and the clock is
-- the database's, read once after the lock was granted.
-- A bucket is GCRA's "full at" time: it holds burst - ceil(deficit * rate / per)
-- tokens; n tokens push full_at to max(full_at, now) + ceil(n * per / rate).
-- Keys (job.rate_key) each have a bucket. A claim visits at most `most` of the
-- distinct keys with claimable rows, walked on job_rate_key_idx (one short probe
-- per key) from the key after `after` (where the previous claim of the topic
-- stopped) to the end, then from the first key, so its cost never grows with the
-- number of keys and every key gets its turn. The head of every visited key with
-- tokens is taken, then the best of those heads, so a busy key never starves the
-- others. Rows of keys whose bucket is full again are deleted (`most` at a time).
-- On a fair topic (%(fair)s) the heads go by the turns from the topic's cursor, as a claim
-- of fair_walk does (brooq/engine/rotation.py: round, then the key's place in the rotation,
-- which its name and the cursor's give), and the claim moves the cursor; among the keys it
-- visits, so exact while at most `most` keys have ready jobs.
-- Jobs without a key are looked for only while `unkeyed` (see limited.py).
-- Returns, on every row (one row of NULL jobs when none was claimed): wait_s, the
-- seconds until a visited key that still has ready jobs but no token gets one (NULL:
-- none waits for the limit); next_after, where the next claim's walk starts ('': the
-- first key); unkeyed_found; then the claimed job's claimed_columns.
WITH RECURSIVE clock AS MATERIALIZED (
    SELECT clock_timestamp() AS t
), {{fair_weights}}, ahead AS (
    (SELECT rate_key FROM job
     WHERE topic = %(topic)s AND state IN ('pending', 'failed') AND rate_key > %(after)s
     ORDER BY rate_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT next.rate_key FROM job AS next
            WHERE next.topic = %(topic)s AND next.state IN ('pending', 'failed')
              AND next.rate_key > ahead.rate_key
            ORDER BY next.rate_key
            LIMIT 1)
    FROM ahead
    WHERE ahead.rate_key IS NOT NULL
), behind AS (
    (SELECT rate_key FROM job
     WHERE topic = %(topic)s AND state IN ('pending', 'failed') AND rate_key IS NOT NULL
       AND rate_key <= %(after)s
     ORDER BY rate_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT next.rate_key FROM job AS next
            WHERE next.topic = %(topic)s AND next.state IN ('pending', 'failed')
              AND next.rate_key > behind.rate_key AND next.rate_key <= %(after)s
            ORDER BY next.rate_key
            LIMIT 1)
    FROM behind
    WHERE behind.rate_key IS NOT NULL
), keys AS MATERIALIZED (
    -- Lazily: the walk stops after `most` keys (behind is read only if ahead ran out).
    SELECT walk.rate_key, row_number() OVER () AS seq
    FROM (SELECT rate_key FROM ahead WHERE rate_key IS NOT NULL
          UNION ALL
          SELECT rate_key FROM behind WHERE rate_key IS NOT NULL
          LIMIT %(most)s) AS walk
), buckets AS MATERIALIZED (
    SELECT k.key, bucket.full_at,
           GREATEST(0, %(burst)s - ceil({{bucket_deficit_us}} * %(rate)s / %(per_us)s))::int
               AS tokens
    FROM (SELECT '' AS key UNION ALL SELECT rate_key FROM keys) AS k
    CROSS JOIN clock
    LEFT JOIN brooq_rate_limit AS bucket ON bucket.topic = %(topic)s AND bucket.key = k.key
), {{fair_cursor}}, turn_of AS MATERIALIZED (
    -- Each visited key's segment of the rotation (0: the cursor's key, its turn going on;
    -- 1: the keys after it; 2: from the first key ('') to the cursor's, its turn used up;
    -- by name within one), its weight and its base; only on a fair topic.
    SELECT b.key, COALESCE(w.weight, 1) AS weight,
           CASE WHEN b.key = c.key AND c.continues THEN 0 WHEN b.key > c.key THEN 1 ELSE 2 END
               AS seg,
           CASE WHEN b.key = c.key AND c.continues THEN c.used ELSE 0 END AS base
    FROM buckets AS b
    CROSS JOIN fair_cursor AS c
    LEFT JOIN fair_weights AS w ON w.key = b.key
    WHERE %(fair)s
), keyed AS (
    SELECT head.id, head.priority, head.available_at, b.key, {{fair_turn}}
    FROM buckets AS b
    LEFT JOIN turn_of AS t ON t.key = b.key
    CROSS JOIN LATERAL (
        SELECT id, priority, available_at, {{fair_place}} AS place
        FROM (SELECT id, priority, available_at FROM job
              WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s AND rate_key = b.key
              ORDER BY {{claim_order}}
              LIMIT LEAST(b.tokens, %(limit)s)
              FOR NO KEY UPDATE SKIP LOCKED) AS oldest
    ) AS head
    WHERE b.key <> '' AND b.tokens > 0
), unkeyed AS (
    -- Not looked for (LIMIT 0 runs no scan) while `unkeyed` is false: the caller's last
    -- look found no job without a key, and this scan would pass over every keyed one.
    SELECT head.id, head.priority, head.available_at, ''::text AS key, {{fair_turn}}
    FROM (SELECT id, priority, available_at, {{fair_place}} AS place
          FROM (SELECT id, priority, available_at FROM job
                WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
                  AND rate_key IS NULL
                ORDER BY {{claim_order}}
                LIMIT CASE WHEN %(unkeyed)s
                           THEN LEAST(%(limit)s, (SELECT tokens FROM buckets WHERE key = ''))
                           ELSE 0 END
                FOR NO KEY UPDATE SKIP LOCKED) AS oldest) AS head
    LEFT JOIN turn_of AS t ON t.key = ''
), chosen AS (
    -- Keys count in the order only on a fair topic (its turns); elsewhere the heads of
    -- every key go by claim order, so jobs without a key do not jump the others.
    SELECT id, key, round, base,
           row_number() OVER (ORDER BY priority DESC, round, seg,
                                       CASE WHEN %(fair)s THEN key END, available_at, id)
               AS seq
    FROM (SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed) AS heads
    ORDER BY priority DESC, round, seg, CASE WHEN %(fair)s THEN key END, available_at, id
    LIMIT CASE WHEN %(max_running)s::int IS NULL THEN %(limit)s
               ELSE GREATEST(0, LEAST(%(limit)s, %(max_running)s::int - (
                   SELECT count(*) FROM job AS running
                   WHERE running.state = 'processing' AND running.topic = %(topic)s)))
          END
), claimed AS (
    UPDATE job
    SET {{claim_set}}
    FROM unnest(ARRAY(SELECT id FROM chosen)) AS picked (job_id)
    WHERE job.id = picked.job_id
    RETURNING {{claimed_columns}}, rate_key
), used AS (
    SELECT k.key, ceil(count(claimed.id) * %(per_us)s::numeric / %(rate)s)::bigint AS cost_us
    FROM (SELECT '' AS key UNION SELECT rate_key FROM claimed WHERE rate_key IS NOT NULL) AS k
    LEFT JOIN claimed ON COALESCE(claimed.rate_key, '') = k.key
    GROUP BY k.key
), spent AS (
    INSERT INTO brooq_rate_limit AS bucket (topic, key, rate, per, burst, full_at)
    SELECT %(topic)s, used.key, %(rate)s, %(per)s, %(burst)s,
           clock.t + used.cost_us * interval '1 microsecond'
    FROM used CROSS JOIN clock
    ON CONFLICT (topic, key) DO UPDATE
    SET full_at = GREATEST(bucket.full_at, (SELECT t FROM clock))
                  + (SELECT cost_us FROM used WHERE used.key = EXCLUDED.key)
                    * interval '1 microsecond',
        rate = EXCLUDED.rate, per = EXCLUDED.per, burst = EXCLUDED.burst
    WHERE EXCLUDED.full_at > (SELECT t FROM clock)
       OR (bucket.rate, bucket.per, bucket.burst)
          IS DISTINCT FROM (EXCLUDED.rate, EXCLUDED.per, EXCLUDED.burst)
    RETURNING bucket.key, bucket.full_at
), fair_last AS (
    -- The last job claimed in the order of the turns (a fair topic only).
    SELECT chosen.key, chosen.round, chosen.base FROM chosen
    JOIN claimed ON claimed.id = chosen.id
    WHERE %(fair)s
    ORDER BY chosen.seq DESC
    LIMIT 1
), fair_turned AS (
    INSERT INTO brooq_fair_cursor AS c (topic, key, used)
    SELECT %(topic)s, l.key,
           l.base + (SELECT count(*) FROM chosen JOIN claimed ON claimed.id = chosen.id
                     WHERE chosen.key = l.key AND chosen.round = l.round)
    FROM fair_last AS l
    ON CONFLICT (topic) DO UPDATE SET key = EXCLUDED.key, used = EXCLUDED.used
), idle AS (
    -- SKIP LOCKED: a bucket a release is refunding is left for the next claim.
    DELETE FROM brooq_rate_limit AS bucket
    WHERE (bucket.topic, bucket.key) IN (
        SELECT topic, key FROM brooq_rate_limit, clock
        WHERE topic = %(topic)s AND key <> '' AND full_at <= clock.t
          AND key NOT IN (SELECT key FROM used)
        LIMIT %(most)s
        FOR UPDATE OF brooq_rate_limit SKIP LOCKED)
), starved AS MATERIALIZED (
    -- The buckets left without a whole token: only these are asked for ready jobs below.
    SELECT b.key, COALESCE(spent.full_at, b.full_at) AS full_at
    FROM buckets AS b
    CROSS JOIN clock
    LEFT JOIN spent ON spent.key = b.key
    WHERE %(burst)s - ceil(GREATEST(0, EXTRACT(EPOCH FROM COALESCE(spent.full_at, b.full_at)
                                              - clock.t) * 1000000)
                           * %(rate)s / %(per_us)s) < 1
      AND (b.key <> '' OR %(unkeyed)s)
), waits AS (
    SELECT min(EXTRACT(EPOCH FROM b.full_at - clock.t)
               - floor((%(burst)s - 1) * %(per_us)s::numeric / %(rate)s) / 1000000)::float8
               AS wait_s
    FROM starved AS b
    CROSS JOIN clock
    WHERE CASE WHEN b.key = ''
               THEN (SELECT id FROM job
                     WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
                       AND rate_key IS NULL
                       AND NOT (id = ANY(ARRAY(SELECT id FROM claimed)))
                     ORDER BY {{claim_order}}
                     LIMIT 1)
               ELSE (SELECT id FROM job
                     WHERE {{ready}} AND {{served_version}} AND topic = %(topic)s
                       AND rate_key = b.key
                       AND NOT (id = ANY(ARRAY(SELECT id FROM claimed)))
                     ORDER BY {{claim_order}}
                     LIMIT 1)
          END IS NOT NULL
), walked AS (
    -- A walk cut at `most` keys goes on after its last key; a whole walk starts over.
    SELECT CASE WHEN count(*) < %(most)s THEN ''
                ELSE (SELECT rate_key FROM keys ORDER BY seq DESC LIMIT 1)
           END AS next_after,
           -- Whether jobs without a key were found (NULL: not looked for, or no token).
           CASE WHEN %(unkeyed)s AND (SELECT tokens FROM buckets WHERE key = '') > 0
                THEN EXISTS (SELECT FROM unkeyed) END AS unkeyed_found
    FROM keys
)
SELECT waits.wait_s, walked.next_after, walked.unkeyed_found, claimed.id, claimed.topic,
       claimed.payload, claimed.attempts, claimed.expirations, claimed.locked_until,
       claimed.priority, claimed.available_at, claimed.max_attempts, claimed.attempt_timeout,
       claimed.max_execution_timeout, claimed.backoff_base, claimed.backoff_max,
       claimed.trace_context
FROM waits CROSS JOIN walked LEFT JOIN claimed ON true

-- name: settle
-- Write the outcome of one attempt, if this holder still holds this attempt,
-- with the handler's result when it is done, and resolve its children's edges.
-- A refund (PreserveAttempt) never takes attempts below the expirations.
WITH RECURSIVE settled AS (
    UPDATE job
    SET state = %(state)s,
        attempts = GREATEST(attempts - %(refund)s, expirations),
        expiry_streak = 0,
        available_at = CASE WHEN %(state)s = 'failed'
                            THEN now() + %(retry_in)s ELSE available_at END,
        last_error = COALESCE(%(error)s, last_error),
        last_traceback = CASE WHEN %(error)s IS NULL THEN last_traceback ELSE %(traceback)s END,
        result = CASE WHEN %(state)s = 'done' THEN %(result)s::jsonb ELSE result END,
        updated_at = now()
    WHERE id = %(id)s AND {{held}}
    RETURNING id, state
), notified AS (
    {{notify_ended}}
), ended AS (
    SELECT id, state FROM settled
), {{resolve_children}}
SELECT id FROM settled
{{notify_forced}} AND {{resolve_forced}}

-- name: settle_many
-- The completer: the outcomes of many attempts in one statement, each row
-- fenced like `settle`, and their children's edges. Rows not returned were no
-- longer held (lease lost).
WITH RECURSIVE settled AS (
    UPDATE job
    SET state = o.state,
        attempts = GREATEST(job.attempts - o.refund, job.expirations),
        expiry_streak = 0,
        available_at = CASE WHEN o.state = 'failed'
                            THEN now() + make_interval(secs => o.retry_s) ELSE job.available_at END,
        last_error = COALESCE(o.error, job.last_error),
        last_traceback = CASE WHEN o.error IS NULL THEN job.last_traceback ELSE o.traceback END,
        result = CASE WHEN o.state = 'done' THEN o.result::jsonb ELSE job.result END,
        updated_at = now()
    FROM jsonb_to_recordset(%(outcomes)s::jsonb)
         AS o(id uuid, holder text, attempt int, state text, refund int, retry_s float8,
              error text, traceback text, result text)
    WHERE job.id = o.id AND (job.state = 'processing') IS TRUE  -- by id: held_by_tickets
      AND job.locked_by = o.holder AND job.attempts = o.attempt
    RETURNING job.id, job.topic, job.state
), notified AS (
    {{notify_ended}}
), ended AS (
    SELECT id, state FROM settled
), {{resolve_children}}
SELECT id, topic, state FROM settled
{{notify_forced}} AND {{resolve_forced}}

-- name: heartbeat
-- Extend every lease still held, in one statement whatever their number.
UPDATE job
SET locked_until = now() + %(lease)s
{{held_by_tickets}}
RETURNING job.id, job.locked_until

-- fragment: refund_tokens
-- Jobs given back unstarted give back the tokens their claims took from a rate
-- limit's bucket: its full_at moves back by their time, rounded down (never
-- more than the claim took). A full or missing bucket stays full.
refunded AS (
    UPDATE brooq_rate_limit AS bucket
    SET full_at = bucket.full_at
                  - floor(gone.n * EXTRACT(EPOCH FROM bucket.per) * 1000000 / bucket.rate)::bigint
                    * interval '1 microsecond'
    FROM (SELECT topic, COALESCE(rate_key, '') AS key, count(*) AS n
          FROM released GROUP BY 1, 2) AS gone
    WHERE bucket.topic = gone.topic AND bucket.key = gone.key
      AND bucket.full_at > clock_timestamp()
)

-- name: release
-- Give jobs back without charging their attempt: they did not run, or the
-- supervisor stopped their handlers (shutdown), not the jobs' own fault.
WITH released AS (
    UPDATE job
    SET state = 'pending', attempts = GREATEST(job.attempts - 1, job.expirations),
        locked_by = NULL, locked_until = NULL, available_at = now(), updated_at = now()
    {{held_by_tickets}}
    RETURNING job.id, job.topic, job.rate_key
), {{refund_tokens}}
SELECT id FROM released

-- name: release_unknown
-- After a round trip whose answer was lost (the connection broke mid-claim),
-- rows this holder claimed but never heard of are given back, uncharged. The
-- holder is unique per process start, so no other process's rows match.
WITH released AS (
    UPDATE job
    SET state = 'pending', attempts = GREATEST(attempts - 1, expirations),
        locked_by = NULL, locked_until = NULL, available_at = now(), updated_at = now()
    WHERE state = 'processing' AND locked_by = %(holder)s AND NOT (id = ANY(%(known)s::uuid[]))
    RETURNING id, topic, rate_key
), {{refund_tokens}}
SELECT id FROM released

-- name: requeue_expired
-- The reaper: a lease ran out (the holder's host or supervisor died). Not a
-- failure: attempts stay as they are and expirations counts it. A job whose
-- lease expired max_expirations times in a row (no outcome recorded between
-- them) goes dead: it may be killing its host.
-- At most `batch` rows a call, so no call holds the table for long. A job it moves to
-- dead resolves its children's edges, as a settle would. Only the leases that ran out
-- within `window` of now() (NULL: all of them; brooq/postgres/upkeep.py, ReapWindow).
WITH RECURSIVE reaped AS (
UPDATE job
SET state = CASE WHEN %(max_expirations)s > 0 AND expiry_streak + 1 >= %(max_expirations)s
                 THEN 'dead' ELSE 'pending' END,
    expirations = expirations + 1,
    expiry_streak = expiry_streak + 1,
    last_error = CASE WHEN %(max_expirations)s > 0 AND expiry_streak + 1 >= %(max_expirations)s
                      THEN format('lease expired %%s times in a row: its holder died every time '
                                  'it ran (last holder %%s); the job may be killing its host',
                                  expiry_streak + 1, locked_by)
                      ELSE last_error END,
    locked_by = CASE WHEN %(max_expirations)s > 0 AND expiry_streak + 1 >= %(max_expirations)s
                     THEN locked_by END,
    locked_until = NULL, available_at = now(), updated_at = now()
FROM unnest(ARRAY(
    SELECT id FROM job
    WHERE state = 'processing' AND locked_until < now()
      AND locked_until >= COALESCE(now() - %(window)s::interval, '-infinity'::timestamptz)
    ORDER BY locked_until
    LIMIT %(batch)s
    FOR NO KEY UPDATE SKIP LOCKED
)) AS picked (job_id)
WHERE job.id = picked.job_id AND state = 'processing' AND locked_until < now()
RETURNING id, topic, state
), ended AS (
    SELECT id, state FROM reaped WHERE state = 'dead'
), {{resolve_children}}
SELECT topic, state FROM reaped
WHERE {{resolve_forced}}

-- fragment: keys_gone
-- The idempotency keys of the rows a `gone` CTE deleted leave with them (data-modifying
-- CTEs always run, read or not): a key is held exactly as long as its row exists.
keys_gone AS (
    DELETE FROM job_key AS held
    USING gone
    WHERE held.topic = gone.topic AND held.idempotency_key = gone.idempotency_key
      AND held.job_id = gone.id
)

-- name: delete_terminal
-- Retention, row by row: one batch of terminal rows older than the TTL, oldest first,
-- their keys and their edges. (Whole partitions go with brooq_job_drop_partition.) A
-- parent whose children have not ended stays (they may read its result).
WITH gone AS (
    DELETE FROM job
    USING unnest(ARRAY(
        SELECT id FROM job
        WHERE state IN ('done', 'dead', 'canceled') AND updated_at < now() - %(ttl)s
          AND NOT {{waited_for}}
        ORDER BY updated_at
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    )) AS picked (job_id)
    WHERE job.id = picked.job_id
    RETURNING id, topic, idempotency_key
), {{keys_gone}}, {{edges_gone}}
SELECT topic FROM gone

-- name: cancel
-- Cancel a job that is not terminal yet; a running handler learns through
-- the NOTIFY (fast) or its next heartbeat (lease lost). Its children's edges
-- are resolved in the same statement.
WITH RECURSIVE canceled AS (
    UPDATE job
    SET state = 'canceled', updated_at = now(),
        last_error = COALESCE('canceled: ' || %(reason)s, last_error)
    WHERE id = %(id)s AND state IN ('pending', 'failed', 'processing', 'waiting')
    RETURNING id, state
), notified AS (
    SELECT pg_notify('brooq_cancel', id::text) FROM canceled
), ended AS (
    SELECT id, state FROM canceled
), {{resolve_children}}
SELECT id FROM canceled
{{notify_forced}} AND {{resolve_forced}}

-- name: get
-- The fate of a job: one SELECT. The payload comes as text: Python may not decode it.
SELECT id, topic, payload::text AS payload, state, attempts, expirations, expiry_streak,
       priority, available_at, locked_by, locked_until, idempotency_key, last_error,
       last_traceback, created_at, updated_at, result::text AS result, rate_key, workflow_id,
       parents_left, if_parent_fails, max_attempts, attempt_timeout, max_execution_timeout,
       backoff_base, backoff_max, trace_context, app_version
FROM job
WHERE id = %(id)s

-- name: last_scheduled_run
-- When the latest run of a periodic schedule was enqueued (its available_at): the schedule's
-- runs are the jobs whose keys start with its prefix (job_key's index, by topic).
SELECT max(job.available_at)
FROM unnest(ARRAY(
    SELECT job_id FROM job_key
    WHERE topic = %(topic)s AND idempotency_key LIKE %(key_prefix)s
)) AS run (job_id)
JOIN job ON job.id = run.job_id

-- name: listen_jobs
LISTEN brooq_job

-- name: listen_done
LISTEN brooq_done

-- name: listen_cancels
LISTEN brooq_cancel

-- name: ping
SELECT 1

-- name: terminate_cut_backends
-- The backends of connections this process cut as stuck (a frozen server
-- process, a silent proxy): each may still hold a statement it has not run,
-- a claim whose rows nobody would hear of. Ended by pid, and only if that
-- pid still serves the client port that was cut (a pid can be reused).
SELECT pg_terminate_backend(a.pid)
FROM pg_stat_activity a
JOIN unnest(%(pids)s::int[], %(ports)s::int[]) AS cut(pid, port)
  ON a.pid = cut.pid AND a.client_port = cut.port
WHERE a.datname = current_database()

-- name: limit_statement_time
-- Bounds the statements of the current transaction (admin reads at scrape time).
SELECT set_config('statement_timeout', %(timeout)s, true)

-- name: limit_idle_time
-- Ends the session should the current transaction sit idle that long (a worker
-- that died inside its settle while a process it forked keeps its socket open):
-- its locks never hold the supervisor's statements for longer.
SELECT set_config('idle_in_transaction_session_timeout', %(timeout)s, true)

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
WHERE {{ready}}
GROUP BY topic
ORDER BY topic

-- name: running
-- What is in flight and who holds it.
SELECT id, topic, locked_by, attempts, expirations,
       EXTRACT(EPOCH FROM locked_until - now()) AS lease_left_s
FROM job
WHERE state = 'processing'
ORDER BY locked_until

-- name: rate_limits
-- Each topic's rate limit as its claims last wrote it; the tokens its own bucket holds
-- now (fractions included), and its keys' buckets in use (not full) and those holding
-- no whole token.
SELECT t.topic, t.rate, EXTRACT(EPOCH FROM t.per)::float8 AS per_s, t.burst,
       GREATEST(0, t.burst - GREATEST(0, EXTRACT(EPOCH FROM t.full_at - clock_timestamp()))
                             * t.rate / EXTRACT(EPOCH FROM t.per))::float8 AS tokens,
       count(k.key)::int AS keys,
       (count(k.key) FILTER (
           WHERE k.burst - ceil(EXTRACT(EPOCH FROM k.full_at - clock_timestamp()) * k.rate
                                / EXTRACT(EPOCH FROM k.per)) < 1))::int AS keys_waiting
FROM brooq_rate_limit AS t
LEFT JOIN brooq_rate_limit AS k
       ON k.topic = t.topic AND k.key <> '' AND k.full_at > clock_timestamp()
WHERE t.key = ''
GROUP BY t.topic, t.rate, t.per, t.burst, t.full_at
ORDER BY t.topic

-- name: declare_rates
-- The rate limits a supervisor serves, written into their topics' buckets before any
-- claim (a missing bucket is created full), so operators see them from the start.
INSERT INTO brooq_rate_limit AS bucket (topic, key, rate, per, burst, full_at)
SELECT topic, '', rate, per, burst, now()
FROM unnest(%(topics)s::text[], %(rates)s::int[], %(pers)s::interval[], %(bursts)s::int[])
     AS declared(topic, rate, per, burst)
ORDER BY topic
ON CONFLICT (topic, key) DO UPDATE
SET rate = EXCLUDED.rate, per = EXCLUDED.per, burst = EXCLUDED.burst
WHERE (bucket.rate, bucket.per, bucket.burst)
      IS DISTINCT FROM (EXCLUDED.rate, EXCLUDED.per, EXCLUDED.burst)

-- name: recent_dead
-- Jobs that went dead recently, newest first (capped), and their total.
SELECT id, topic, attempts, expirations, last_error, updated_at
FROM job
WHERE state = 'dead' AND updated_at > now() - %(since)s
ORDER BY updated_at DESC
LIMIT %(limit)s

-- name: count_dead
SELECT count(*) AS dead FROM job WHERE state = 'dead' AND updated_at > now() - %(since)s

-- fragment: job_filter
-- An operator's filter (brooq.engine.filters.JobFilter): empty arrays and NULLs match all.
(cardinality(%(topics)s::text[]) = 0 OR topic = ANY(%(topics)s::text[]))
AND (%(state)s::text IS NULL OR state = %(state)s::text)
AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s::timestamptz)
AND (%(until)s::timestamptz IS NULL OR updated_at < %(until)s::timestamptz)
AND (cardinality(%(ids)s::uuid[]) = 0 OR id = ANY(%(ids)s::uuid[]))
AND (%(workflow)s::uuid IS NULL OR workflow_id = %(workflow)s::uuid)

-- name: list_jobs
-- A page of a listing, newest first, after a keyset cursor (never OFFSET).
SELECT id, topic, state, attempts, expirations, priority, available_at, updated_at,
       left(last_error, 300) AS last_error
FROM job
WHERE {{job_filter}}
  AND (%(after_at)s::timestamptz IS NULL
       OR (updated_at, id) < (%(after_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY updated_at DESC, id DESC
LIMIT %(limit)s

-- name: count_jobs
SELECT count(*) AS jobs FROM job WHERE {{job_filter}}

-- name: retry_pick
-- One batch of an operator's retry: dead (or canceled) rows, locked until the batch's
-- transaction ends. The state guard is here, in the statement: a live row (waiting,
-- pending, failed, processing) or a done one is never touched. In id order: a workflow's
-- parents come before their children (ids follow the order jobs were added).
SELECT id FROM job
WHERE {{job_filter}} AND state = %(state)s::text AND state IN ('dead', 'canceled')
ORDER BY id
LIMIT %(batch)s
FOR NO KEY UPDATE SKIP LOCKED

-- name: retry_rearm
-- The retried jobs' children wait for them again: each edge from a retried job opens
-- again, and its child (unless retried in this batch too) counts one more parent left;
-- one that was pending or failed (its parents had all ended) waits again. The children
-- are locked in id order, as resolve_children locks them.
WITH rearmed AS (
    UPDATE job_edge
    SET parent_state = NULL
    WHERE parent_id = ANY(%(ids)s::uuid[]) AND parent_state IS NOT NULL
    RETURNING child_id
), tally AS (
    SELECT child_id, count(*) AS opened FROM rearmed
    WHERE child_id <> ALL(%(ids)s::uuid[])
    GROUP BY child_id
), locked AS (
    SELECT id, state FROM job
    WHERE id IN (SELECT child_id FROM tally)
    ORDER BY id
    FOR NO KEY UPDATE
)
UPDATE job
SET parents_left = job.parents_left + tally.opened,
    state = CASE WHEN locked.state IN ('pending', 'failed') THEN 'waiting' ELSE job.state END,
    updated_at = CASE WHEN locked.state IN ('pending', 'failed') THEN now() ELSE job.updated_at END
FROM locked JOIN tally ON tally.child_id = locked.id
WHERE job.id = locked.id

-- name: retry_picked
-- The picked rows back as new, attempts and expirations reset, the idempotency key
-- kept: waiting when some parent has not ended (counted now, in this statement's
-- snapshot, taken after the batch locked them: an edge resolved meanwhile had to wait
-- for that lock), else pending now.
WITH open AS (
    SELECT picked.id,
           (SELECT count(*) FROM job_edge AS e
            WHERE e.child_id = picked.id AND e.parent_state IS NULL) AS parents_left
    FROM unnest(%(ids)s::uuid[]) AS picked (id)
), retried AS (
    UPDATE job
    SET state = CASE WHEN open.parents_left > 0 THEN 'waiting' ELSE 'pending' END,
        parents_left = open.parents_left, attempts = 0, expirations = 0, expiry_streak = 0,
        available_at = now(), locked_by = NULL, locked_until = NULL, updated_at = now()
    FROM open
    WHERE job.id = open.id AND job.state IN ('dead', 'canceled')
    RETURNING job.id, job.topic, job.state
), notified AS (
    SELECT pg_notify('brooq_job', topic)
    FROM (SELECT DISTINCT topic FROM retried WHERE state = 'pending') AS t
)
SELECT id FROM retried
{{notify_forced}}

-- name: cancel_jobs
-- Bulk cancel of jobs that wait (waiting, pending, failed); running ones are canceled
-- one at a time (`cancel`), so their handlers hear of it. Their children's edges are
-- resolved in the same statement.
WITH RECURSIVE picked AS (
    SELECT id FROM job
    WHERE {{job_filter}} AND state IN ('waiting', 'pending', 'failed')
    ORDER BY id
    LIMIT %(batch)s
    FOR NO KEY UPDATE SKIP LOCKED
), canceled AS (
    UPDATE job
    SET state = 'canceled', updated_at = now(),
        last_error = COALESCE('canceled: ' || %(reason)s, last_error)
    FROM picked
    WHERE job.id = picked.id AND job.state IN ('waiting', 'pending', 'failed')
    RETURNING job.id, job.state
), ended AS (
    SELECT id, state FROM canceled
), {{resolve_children}}
SELECT count(*) AS canceled FROM canceled
WHERE {{resolve_forced}}

-- name: retarget_jobs
-- One batch of an operator's retarget (brooq jobs retarget): jobs not started yet (waiting,
-- pending, failed) of app version %(from_version)s (NULL: unversioned) move to version
-- %(to_version)s, so supervisors of that version claim them. Rows locked by another
-- transaction are passed over (a claim in flight takes them as they were). One NOTIFY per
-- topic with a ready row moved: the target's idle supervisors look at once.
WITH picked AS (
    SELECT id FROM job
    WHERE {{job_filter}} AND state IN ('waiting', 'pending', 'failed')
      AND app_version IS NOT DISTINCT FROM %(from_version)s::text
    ORDER BY id
    LIMIT %(batch)s
    FOR NO KEY UPDATE SKIP LOCKED
), moved AS (
    UPDATE job
    SET app_version = %(to_version)s::text, updated_at = now()
    FROM picked
    WHERE job.id = picked.id AND job.state IN ('waiting', 'pending', 'failed')
    RETURNING job.topic, job.state
), notified AS (
    SELECT pg_notify('brooq_job', topic)
    FROM (SELECT DISTINCT topic FROM moved WHERE state <> 'waiting') AS t
)
SELECT count(*) AS moved FROM moved
{{notify_forced}}

-- name: count_retargetable
-- What a retarget's filter still matches (its dry run, and what it left).
SELECT count(*) AS jobs FROM job
WHERE {{job_filter}} AND state IN ('waiting', 'pending', 'failed')
  AND app_version IS NOT DISTINCT FROM %(from_version)s::text

-- name: pending_by_version
-- Jobs not started yet (waiting, pending, failed) per topic and app version, for `brooq
-- status`, `brooq workers`, the dashboard and the metrics: a read of every such row, bounded
-- by the operator reads' statement timeout.
SELECT topic, app_version, count(*) AS jobs
FROM job
WHERE state IN ('waiting', 'pending', 'failed')
GROUP BY topic, app_version
ORDER BY topic, app_version NULLS FIRST

-- name: count_cancelable
-- What a bulk cancel's filter still matches in a state it may cancel, after its batches:
-- rows another transaction kept locked (SKIP LOCKED passed them), or enqueued since.
SELECT count(*) AS jobs FROM job
WHERE {{job_filter}} AND state IN ('waiting', 'pending', 'failed')

-- name: purge_jobs
-- One batch of an operator's purge: terminal rows only, whatever the filter says, and
-- their keys and their edges; a parent whose children have not ended stays, as with
-- retention.
WITH gone AS (
    DELETE FROM job
    USING unnest(ARRAY(
        SELECT id FROM job
        WHERE {{job_filter}} AND state IN ('done', 'dead', 'canceled') AND NOT {{waited_for}}
        ORDER BY updated_at
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    )) AS picked (job_id)
    WHERE job.id = picked.job_id AND state IN ('done', 'dead', 'canceled')
    RETURNING id, topic, idempotency_key
), {{keys_gone}}, {{edges_gone}}
SELECT count(*) FROM gone

-- name: throughput
-- Jobs that reached done or dead per minute, over a window (zeros included).
-- updated_at of a terminal row is when it settled: terminal rows never change.
SELECT minute,
       count(job.id) FILTER (WHERE job.state = 'done') AS done,
       count(job.id) FILTER (WHERE job.state = 'dead') AS dead
FROM generate_series(date_trunc('minute', now() - %(since)s), date_trunc('minute', now()),
                     interval '1 minute') AS minute
LEFT JOIN job ON job.state IN ('done', 'dead')
             AND job.updated_at >= minute AND job.updated_at < minute + interval '1 minute'
GROUP BY minute
ORDER BY minute

-- name: pause_topic
-- Pause a topic on every host (brooq topics pause): claimers read brooq_topic_pause at
-- least every half second, and supervisors at once on NOTIFY brooq_pause. Pausing a
-- paused topic keeps when it was paused and replaces why and by whom.
WITH paused AS (
    INSERT INTO brooq_topic_pause AS p (topic, reason, paused_by)
    VALUES (%(topic)s, %(reason)s, %(by)s)
    ON CONFLICT (topic) DO UPDATE SET reason = EXCLUDED.reason, paused_by = EXCLUDED.paused_by
    RETURNING p.topic, p.reason, p.paused_at, p.paused_by
), told AS (
    SELECT pg_notify('brooq_pause', topic) FROM paused
)
SELECT paused.* FROM paused LEFT JOIN told ON true

-- name: resume_topic
-- Lift a topic's pause; the pause lifted (no row: it was not paused). Claimers that wait
-- for new jobs hear of its jobs as if they were just enqueued (brooq_job).
WITH resumed AS (
    DELETE FROM brooq_topic_pause WHERE topic = %(topic)s
    RETURNING topic, reason, paused_at, paused_by
), told AS (
    SELECT pg_notify('brooq_pause', topic), pg_notify('brooq_job', topic) FROM resumed
)
SELECT resumed.* FROM resumed LEFT JOIN told ON true

-- name: topic_pauses
-- Every paused topic, by name.
SELECT topic, reason, paused_at, paused_by FROM brooq_topic_pause ORDER BY topic

-- name: paused_topic_names
-- What a claimer leaves out of its claims (read at most PAUSE_REFRESH_S old).
SELECT topic FROM brooq_topic_pause

-- name: listen_pauses
LISTEN brooq_pause

-- name: register_supervisor
-- A supervisor says it is alive, and what its workers run (every few seconds).
INSERT INTO brooq_supervisor (holder, host, pid, app, topics, started_at, seen_at, workers,
                              app_version)
VALUES (%(holder)s, %(host)s, %(pid)s, %(app)s, %(topics)s, %(started_at)s, now(),
        %(workers)s::jsonb, %(app_version)s)
ON CONFLICT (holder) DO UPDATE
SET topics = EXCLUDED.topics, seen_at = now(), workers = EXCLUDED.workers,
    app_version = EXCLUDED.app_version

-- name: expire_supervisors
-- Rows of supervisors not seen for a long while: they died without a clean stop.
-- A row dated as far ahead was not written by a supervisor (they write now()).
DELETE FROM brooq_supervisor
WHERE seen_at < now() - %(expire_after)s OR seen_at > now() + %(expire_after)s

-- name: unregister_supervisor
DELETE FROM brooq_supervisor WHERE holder = %(holder)s

-- name: supervisors
-- Every registered supervisor; alive = seen within the window of the database's
-- clock, on either side (a row dated ahead is not alive forever). Values the
-- driver cannot load (infinity, a deep jsonb) come as text, for the reader to
-- check row by row.
SELECT holder, host, pid, app, topics,
       CASE WHEN isfinite(started_at) THEN started_at END AS started_at,
       CASE WHEN isfinite(seen_at) THEN seen_at END AS seen_at,
       started_at::text AS started_at_text, seen_at::text AS seen_at_text,
       workers::text AS workers, app_version,
       seen_at BETWEEN now() - %(alive_within)s AND now() + %(alive_within)s AS alive
FROM brooq_supervisor
ORDER BY alive DESC, host, pid

-- name: jit_on
-- Whether this session would JIT-compile its plans: a connection brooq opens turns it off
-- with a startup option, but through PgBouncer (which refuses those); ALTER ROLE … SET jit
-- = off does it there.
SELECT current_setting('jit') = 'on' AS jit_on

-- name: connection_room
-- How many more client connections the server would accept now: max_connections
-- less the reserved slots and the client backends already connected.
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int
       + COALESCE(NULLIF(current_setting('reserved_connections', true), ''), '0')::int
       AS reserved,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int
       AS in_use

-- name: schema_facts
-- What the migrations left in the catalog (brooq/postgres/schema.py names what each
-- migration leaves): brooq's relations next to job, job's columns, its storage options (a
-- partitioned table holds none: its partitions' are read), and
-- whether brooq migrate's bookkeeping is readable. The catalog is readable by every role.
WITH job AS (SELECT c.oid, c.relnamespace, c.reloptions FROM pg_class c
             WHERE c.oid = to_regclass('job'))
SELECT 'relation:' || c.relname
FROM pg_class c JOIN job ON c.relnamespace = job.relnamespace
WHERE c.relname LIKE 'job%' OR c.relname LIKE 'brooq%'
UNION ALL
SELECT 'column:' || a.attname
FROM pg_attribute a JOIN job ON a.attrelid = job.oid
WHERE a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT DISTINCT 'option:' || split_part(o, '=', 1)
FROM job, pg_class c, unnest(c.reloptions) AS o
WHERE c.oid = job.oid
   OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = job.oid)
UNION ALL
SELECT 'readable:_yoyo_migration'
WHERE has_table_privilege(to_regclass('_yoyo_migration'), 'SELECT')

-- name: yoyo_table_exists
SELECT to_regclass('_yoyo_migration') IS NOT NULL AS present

-- name: yoyo_applied_ids
-- What `brooq migrate` recorded (yoyo's table), read without yoyo: yoyo itself would create
-- its lock and log tables first, and a status must not write.
SELECT migration_id FROM _yoyo_migration ORDER BY applied_at_utc, migration_id

-- name: tables_without_dml
-- brooq's tables this role may not read and write (supervise and work need both). One
-- privilege at a time: given a list, has_table_privilege is true when any one is held.
SELECT t FROM unnest(ARRAY['job', 'job_key', 'job_edge', 'brooq_supervisor', 'brooq_rate_limit',
                           'brooq_topic_pause', 'brooq_fair_cursor']) AS t
WHERE to_regclass(t) IS NOT NULL
  AND NOT (has_table_privilege(to_regclass(t), 'SELECT')
           AND has_table_privilege(to_regclass(t), 'INSERT')
           AND has_table_privilege(to_regclass(t), 'UPDATE')
           AND has_table_privilege(to_regclass(t), 'DELETE'))

-- name: parent_states
-- Workflows: the parents an enqueue names that it can see, with their states (an edge to
-- one it cannot see stays open: its transaction may not have committed yet). Read before
-- the jobs are planned (brooq.engine.edges), without a lock: a parent that ends between
-- this read and the enqueue's commit cannot see the new edge, which the reaper's
-- resolve_stranded then resolves.
SELECT id, state FROM job WHERE id = ANY(%(ids)s::uuid[])

-- name: enqueue_graph
-- Jobs with parents (Job(after=…), a workflow), as brooq.engine.edges planned them: each
-- with its state (waiting; pending when every parent had ended; canceled by its policy),
-- its parents left, and its edges (parent_state set for a parent that had ended; open for
-- one not ended, or not visible: resolve_stranded decides); keyed as enqueue_many keys its
-- jobs. Edges go in with the child they belong
-- to, in the same statement: a child whose idempotency key was taken is not inserted,
-- and neither are its edges.
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(jobs)s::jsonb)
        AS input(id uuid, topic text, payload jsonb, key text, at timestamptz,
                 priority smallint, rate_key text, state text, workflow uuid, policy text,
                 parents_left int, error text, {{controls_input}})
), keyed AS (
    INSERT INTO job_key (topic, idempotency_key, job_id)
    SELECT topic, key, id FROM input WHERE key IS NOT NULL
    ON CONFLICT (topic, idempotency_key) DO NOTHING
    RETURNING job_id
), inserted AS (
    INSERT INTO job (id, topic, payload, idempotency_key, available_at, priority, rate_key,
                     state, workflow_id, if_parent_fails, parents_left, last_error,
                     app_version, {{control_columns}})
    SELECT id, topic, COALESCE(payload, 'null'::jsonb), key, COALESCE(at, now()), priority,
           rate_key, state, workflow, policy, parents_left, error, %(app_version)s::text,
           {{control_columns}}
    FROM input
    WHERE key IS NULL OR id IN (SELECT job_id FROM keyed)
    RETURNING id, topic, state
), edges AS (
    INSERT INTO job_edge (parent_id, child_id, parent_state)
    SELECT e.parent_id, e.child_id, e.parent_state
    FROM jsonb_to_recordset(%(edges)s::jsonb) AS e(parent_id uuid, child_id uuid, parent_state text)
    JOIN inserted ON inserted.id = e.child_id
), notified AS (
    SELECT pg_notify('brooq_job', topic)
    FROM (SELECT DISTINCT topic FROM inserted WHERE state = 'pending') AS t
    WHERE %(notify)s
)
SELECT id, true AS created, NULL::text, NULL::text, NULL::text FROM inserted
{{notify_forced}}
UNION ALL
{{held_keys}}
JOIN (SELECT DISTINCT topic, key FROM input
      WHERE key IS NOT NULL AND id NOT IN (SELECT job_id FROM keyed)) AS wanted
  ON held.topic = wanted.topic AND held.idempotency_key = wanted.key

-- name: parents
-- What a child sees of its parents (claim.parents): each one's state now and result; a
-- parent whose row is gone has the end its edge recorded, or none (NULL).
SELECT e.parent_id AS id, COALESCE(p.state, NULLIF(e.parent_state, 'missing')) AS state,
       p.result::text AS result
FROM job_edge AS e
LEFT JOIN job AS p ON p.id = e.parent_id
WHERE e.child_id = %(id)s
ORDER BY e.parent_id

-- name: family
-- A job's parents and children with their states (`brooq job`, the dashboard's job
-- page): at most `limit` of each, by id, and how many there are.
SELECT side, id, state, total
FROM (
    SELECT side, id, state,
           count(*) OVER (PARTITION BY side) AS total,
           row_number() OVER (PARTITION BY side ORDER BY id) AS n
    FROM (
        SELECT 'parent' AS side, e.parent_id AS id,
               COALESCE(p.state, NULLIF(e.parent_state, 'missing')) AS state
        FROM job_edge AS e LEFT JOIN job AS p ON p.id = e.parent_id
        WHERE e.child_id = %(id)s
        UNION ALL
        SELECT 'child', e.child_id, c.state
        FROM job_edge AS e JOIN job AS c ON c.id = e.child_id
        WHERE e.parent_id = %(id)s
    ) AS edge
) AS numbered
WHERE n <= %(limit)s
ORDER BY side DESC, id

-- name: cancel_workflow
-- Every job of a workflow that has not ended, canceled in one statement (running ones
-- too: their supervisors hear of it through brooq_cancel), locked in id order, and the
-- edges to jobs outside the workflow resolved by their policies.
WITH RECURSIVE picked AS (
    SELECT id, state FROM job
    WHERE workflow_id = %(workflow)s AND state IN ('waiting', 'pending', 'failed', 'processing')
    ORDER BY id
    FOR NO KEY UPDATE
), canceled AS (
    UPDATE job
    SET state = 'canceled', updated_at = now(),
        last_error = COALESCE('canceled: ' || %(reason)s, last_error)
    FROM picked
    WHERE job.id = picked.id AND job.state IN ('waiting', 'pending', 'failed', 'processing')
    RETURNING job.id, job.state, picked.state AS was
), notified AS (
    SELECT pg_notify('brooq_cancel', id::text) FROM canceled WHERE was = 'processing'
    UNION ALL
    SELECT pg_notify('brooq_done', '') FROM (SELECT FROM canceled LIMIT 1) AS t
), ended AS (
    SELECT id, state FROM canceled
), {{resolve_children}}
SELECT count(*) AS canceled FROM canceled
{{notify_forced}} AND {{resolve_forced}}

-- name: resolve_stranded
-- The reaper's safety net: edges still open whose parent has ended, or is gone. The
-- statement that ends a parent resolves every edge committed before it began; an edge
-- whose enqueue committed while its parent was ending (it read the parent as live, the
-- settle could not see the edge), or a parent deleted by hand, is resolved here, by the
-- same fragment. A parent nobody can see may be written by a transaction still open (the
-- enqueue leaves its edge open): it is missing only once every child still waiting for it
-- was created more than `grace` ago (brooq.engine.edges.MISSING_PARENT_GRACE). A parent
-- that ended is locked (shared) and read again, so one retried meanwhile is left alone.
WITH RECURSIVE unresolved AS (
    SELECT DISTINCT parent_id AS id FROM job_edge WHERE parent_state IS NULL
), stranded AS (
    SELECT unresolved.id
    FROM unresolved,
         LATERAL (SELECT COALESCE((SELECT job.state FROM job WHERE job.id = unresolved.id),
                                  'missing') AS state) AS parent
    WHERE parent.state IN ('done', 'dead', 'canceled')
       OR (parent.state = 'missing'
           AND NOT EXISTS (SELECT FROM job_edge AS e JOIN job AS c ON c.id = e.child_id
                           WHERE e.parent_id = unresolved.id AND e.parent_state IS NULL
                             AND c.created_at > now() - %(grace)s))
    LIMIT %(batch)s
), finished AS (
    SELECT job.id, job.state FROM job
    WHERE job.id IN (SELECT id FROM stranded) AND job.state IN ('done', 'dead', 'canceled')
    FOR SHARE
), ended AS (
    SELECT id, state FROM finished
    UNION ALL
    SELECT id, 'missing' FROM stranded
    WHERE NOT EXISTS (SELECT FROM job WHERE job.id = stranded.id)
), {{resolve_children}}
SELECT count(*) AS resolved FROM resolved
WHERE {{resolve_forced}}

-- fragment: job_partitions
-- job's partitions and their ranges of ids: lo NULL is from the start (MINVALUE); the
-- default partition (is_default) has neither bound.
SELECT c.oid, c.oid::regclass::text AS name,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([0-9a-f-]+)''\)')::uuid AS lo,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([0-9a-f-]+)''\)')::uuid AS hi,
       pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS is_default
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'job'::regclass

-- name: add_partitions
-- Partitions ahead, up to now + `ahead`, in steps of `step` (see 0009.job-partitions.sql):
-- the names created; none when another host is at it.
SELECT brooq_job_create_partitions(%(step)s, now() + %(ahead)s, %(most)s)

-- name: partitions_past_ttl
-- Partitions whose whole range ended more than the TTL ago and that hold no live row (a
-- waiting one included), no row settled within the TTL, and no parent of a child that has
-- not ended, oldest first: what retention may drop. Each look is one index probe of the
-- partition (pruned by its id range), or of job_edge by parent; brooq_job_drop_partition
-- looks again under its lock.
WITH part AS ({{job_partitions}})
SELECT part.name FROM part
WHERE part.hi <= brooq_job_bound(now() - %(ttl)s)
  AND NOT EXISTS (SELECT FROM job
                  WHERE job.id >= COALESCE(part.lo, '00000000-0000-0000-0000-000000000000')
                    AND job.id < part.hi AND job.state IN ('pending', 'failed'))
  AND NOT EXISTS (SELECT FROM job
                  WHERE job.id >= COALESCE(part.lo, '00000000-0000-0000-0000-000000000000')
                    AND job.id < part.hi AND job.state = 'processing')
  AND NOT EXISTS (SELECT FROM job
                  WHERE job.id >= COALESCE(part.lo, '00000000-0000-0000-0000-000000000000')
                    AND job.id < part.hi AND job.state = 'waiting')
  AND NOT EXISTS (SELECT FROM job_edge AS e JOIN job AS c ON c.id = e.child_id
                  WHERE e.parent_id >= COALESCE(part.lo, '00000000-0000-0000-0000-000000000000')
                    AND e.parent_id < part.hi AND c.state NOT IN ('done', 'dead', 'canceled'))
  AND NOT EXISTS (SELECT FROM job
                  WHERE job.id >= COALESCE(part.lo, '00000000-0000-0000-0000-000000000000')
                    AND job.id < part.hi AND job.state IN ('done', 'dead', 'canceled')
                    AND job.updated_at >= now() - %(ttl)s)
ORDER BY part.hi
LIMIT %(most)s

-- name: drop_partition
-- One partition and its rows' keys, if it may go (see 0009.job-partitions.sql): the rows it
-- held (an estimate), or NULL when it stays.
SELECT brooq_job_drop_partition(%(name)s::regclass, %(ttl)s)

-- name: partitions
-- Every partition of job: its range as times, its rows (the statistics' count, an
-- estimate) and its size on disk. Oldest range first, the default partition last.
WITH part AS ({{job_partitions}})
SELECT part.name, brooq_job_time(part.lo) AS starts, brooq_job_time(part.hi) AS ends,
       part.is_default, COALESCE(s.n_live_tup, 0) AS rows,
       pg_total_relation_size(part.oid) AS bytes
FROM part LEFT JOIN pg_stat_user_tables s ON s.relid = part.oid
ORDER BY part.is_default, part.lo NULLS FIRST
