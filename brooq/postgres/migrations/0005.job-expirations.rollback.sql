ALTER TABLE job DROP COLUMN expirations;
