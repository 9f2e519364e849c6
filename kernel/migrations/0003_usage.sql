-- version 3: what an op's process tree used, from the shim's .code record
-- (wait4/getrusage of everything it reaped); NULL when unknown (no code
-- file, or one written before the shim recorded usage).
ALTER TABLE ops ADD COLUMN cpu_ms INTEGER;       -- user + system CPU, milliseconds
ALTER TABLE ops ADD COLUMN max_rss_kb INTEGER;   -- largest resident set of one process, KiB
