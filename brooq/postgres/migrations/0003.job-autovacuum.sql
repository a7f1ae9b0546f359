-- depends: 0002.job-indexes

-- A queue table sees constant inserts, updates and deletes: vacuum it often and
-- briefly instead of rarely and long (the default waits for 20% dead rows).
ALTER TABLE job SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100);
