ALTER TABLE job DROP COLUMN expiry_streak;
