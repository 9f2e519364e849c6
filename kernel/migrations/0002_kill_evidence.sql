-- version 2: durable kill evidence, the exec record of each op's start, and
-- an index for delivery checks.
ALTER TABLE ops ADD COLUMN kill_signalled INTEGER NOT NULL DEFAULT 0;  -- a signal reached the op's processes
ALTER TABLE ops ADD COLUMN exec_id TEXT;                                -- Docker exec that ran the wrapper
CREATE INDEX ops_undelivered ON ops (run_id) WHERE report_id IS NULL AND delivered_inline = 0;
