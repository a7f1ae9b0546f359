WITH snap AS MATERIALIZED (
    SELECT pg_current_snapshot() AS s
), fresh AS MATERIALIZED (
    SELECT DISTINCT ON (priority) priority, available_at, id
    FROM (
        SELECT priority, available_at, id FROM job
        WHERE topic = %(topic)s AND state IN ('pending', 'failed')
          AND (app_version IS NULL OR app_version = %(app_version)s::text)
          AND id >= %(recent)s::uuid
          AND ready_xid >= %(xmax)s::xid8 AND ready_xid < %(xend)s::xid8
        UNION ALL
        SELECT priority, available_at, id FROM job
        WHERE topic = %(topic)s AND state IN ('pending', 'failed')
          AND (app_version IS NULL OR app_version = %(app_version)s::text)
          AND id >= %(recent)s::uuid
          AND ready_xid = ANY(ARRAY(SELECT unnest(%(xip)s::xid8[])
                                    EXCEPT SELECT pg_snapshot_xip(s) FROM snap))
    ) AS f
    ORDER BY priority DESC, available_at, id
), levels AS MATERIALIZED (
    SELECT COALESCE(k.p, f.priority) AS p,
           CASE WHEN f.priority IS NULL THEN k.at
                WHEN k.p IS NULL OR (f.available_at, f.id) < (k.at, k.id) THEN f.available_at
                ELSE k.at END AS at,
           CASE WHEN f.priority IS NULL THEN k.id
                WHEN k.p IS NULL OR (f.available_at, f.id) < (k.at, k.id) THEN f.id
                ELSE k.id END AS id
    FROM unnest(%(lp)s::int[], %(lat)s::timestamptz[], %(lid)s::uuid[]) AS k (p, at, id)
    FULL JOIN fresh AS f ON f.priority = k.p
), claimed AS (
    UPDATE job
    SET state = 'processing', locked_by = %(holder)s, locked_until = now() + interval '30 seconds',
        attempts = attempts + 1, updated_at = now()
    FROM unnest(ARRAY(
        SELECT j.id FROM levels AS l
        CROSS JOIN LATERAL (
            SELECT id, available_at FROM job
            WHERE topic = %(topic)s AND state IN ('pending', 'failed') AND available_at <= now()
              AND (app_version IS NULL OR app_version = %(app_version)s::text)
              AND priority = l.p AND (available_at, id) >= (l.at, l.id)
            ORDER BY priority DESC, available_at, id
            LIMIT %(limit)s
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS j
        ORDER BY l.p DESC, j.available_at, j.id
        LIMIT %(limit)s
    )) AS picked (job_id)
    WHERE job.id = picked.job_id
    RETURNING job.id, job.priority, job.available_at, job.payload::text AS payload
)
SELECT (SELECT s FROM snap)::text,
       (SELECT json_agg(json_build_array(p, at, id)) FROM levels),
       (SELECT json_agg(json_build_array(id, priority, available_at, payload)) FROM claimed)
