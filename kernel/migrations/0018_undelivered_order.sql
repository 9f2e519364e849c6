-- version 18: two reads that went through history. A report's drain reads
-- a run's undelivered ops in the order it reports them. The index of
-- undelivered ops had only the run, and the planner took the index of the
-- run's ops by status instead: every drain read all of the run's finished
-- ops, delivered or not (its whole history). Ordered by when they
-- finished, the undelivered ops are read alone and already sorted.
DROP INDEX ops_undelivered;
CREATE INDEX ops_undelivered ON ops (run_id, finished_at, id) WHERE report_id IS NULL AND delivered_inline = 0;
-- An admission reads the run's lineage (its ancestors) by the run: the
-- ancestry's key leads with the ancestor, so each read scanned every
-- run's ancestry.
CREATE INDEX run_ancestry_by_run ON run_ancestry (run_id, distance);
