-- version 18 (PostgreSQL dialect of ../0018_undelivered_order.sql): two
-- reads that went through history. A report's drain reads a run's
-- undelivered ops in the order it reports them. The index of undelivered
-- ops had only the run, and the planner took the index of the run's ops
-- by status instead: every drain read all of the run's finished ops,
-- delivered or not (its whole history). Ordered by when they finished,
-- the undelivered ops are read alone and already sorted.
-- An admission reads the run's lineage (its ancestors) by the run: the
-- ancestry's key leads with the ancestor, so each read scanned every
-- run's ancestry.
CREATE INDEX run_ancestry_by_run ON run_ancestry (run_id, distance);
-- built beside the old index (the build lets other nodes read ops), then
-- swapped in: the exclusive lock of the swap lasts only to the commit
CREATE INDEX ops_undelivered_18 ON ops (run_id, finished_at, id) WHERE report_id IS NULL AND delivered_inline = 0;
DROP INDEX ops_undelivered;
ALTER INDEX ops_undelivered_18 RENAME TO ops_undelivered;
