DROP INDEX job_processing_idx;
DROP INDEX job_terminal_idx;
DROP INDEX job_idempotency_idx;
DROP INDEX job_claim_idx;
