DROP TABLE brooq_supervisor;
