-- version 7: an op's process tree ends with the op (SPEC §21). When the
-- command exits, the shim stops the processes it left behind (TERM, grace,
-- KILL, identity-checked) before it writes .code, and records how many;
-- the op's report line says so. 0 for ops settled before (and for ops whose
-- code file predates the count: nothing was stopped then).
ALTER TABLE ops ADD COLUMN leftovers INTEGER NOT NULL DEFAULT 0;  -- distinct processes stopped
