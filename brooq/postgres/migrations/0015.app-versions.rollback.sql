DROP TABLE brooq_fair_clock;
DROP TABLE brooq_fair_turn;
ALTER TABLE brooq_supervisor DROP COLUMN app_version;
ALTER TABLE job DROP CONSTRAINT job_app_version_check;
ALTER TABLE job DROP COLUMN app_version;
