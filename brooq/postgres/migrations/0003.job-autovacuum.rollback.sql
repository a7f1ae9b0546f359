ALTER TABLE job RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
