-- version 2 (PostgreSQL dialect of ../0002_kill_evidence.sql)
ALTER TABLE ops ADD COLUMN kill_signalled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ops ADD COLUMN exec_id TEXT;
CREATE INDEX ops_undelivered ON ops (run_id) WHERE report_id IS NULL AND delivered_inline = 0;
