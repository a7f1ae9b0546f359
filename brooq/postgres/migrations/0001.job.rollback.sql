DROP TABLE job;
DROP FUNCTION brooq_uuid7();
