-- version 3 (PostgreSQL dialect of ../0003_usage.sql)
ALTER TABLE ops ADD COLUMN cpu_ms BIGINT;
ALTER TABLE ops ADD COLUMN max_rss_kb BIGINT;
