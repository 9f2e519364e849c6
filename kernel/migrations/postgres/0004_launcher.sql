-- version 4 (PostgreSQL dialect of ../0004_launcher.sql)
ALTER TABLE ops ADD COLUMN handed_over_at BIGINT;
