-- version 8: bounded growth (SPEC §21).
-- An op's files (.log, .pid, .code) are removed once it is delivered and
-- older than OPKERNEL_OP_FILES_RETENTION; the row keeps its digest, size and
-- tail, and remembers when its files went.
ALTER TABLE ops ADD COLUMN files_pruned_at INTEGER;
CREATE INDEX ops_files_kept ON ops (finished_at) WHERE files_pruned_at IS NULL AND finished_at IS NOT NULL;
-- "has this run been quiet since T": one index probe per run
CREATE INDEX events_by_run_at ON events (run_id, at);

-- the kernel's own journal (not a run's): purges of finished run trees.
-- Append-only like the runs' journals.
CREATE TABLE kernel_journal (
    seq   INTEGER PRIMARY KEY AUTOINCREMENT,
    at    INTEGER NOT NULL,
    kind  TEXT NOT NULL,
    data  TEXT NOT NULL DEFAULT '{}'
);
CREATE TRIGGER kernel_journal_no_update BEFORE UPDATE ON kernel_journal
    BEGIN SELECT RAISE(ABORT, 'the kernel journal is append-only'); END;
CREATE TRIGGER kernel_journal_no_delete BEFORE DELETE ON kernel_journal
    BEGIN SELECT RAISE(ABORT, 'the kernel journal is append-only'); END;

-- the runs a purge transaction is deleting: filled and emptied inside that
-- one transaction (recorded in kernel_journal), the only time the
-- append-only tables give up rows
CREATE TABLE purging (run_id TEXT PRIMARY KEY) WITHOUT ROWID;

DROP TRIGGER usage_no_delete;
CREATE TRIGGER usage_no_delete BEFORE DELETE ON usage
    WHEN NOT EXISTS (SELECT 1 FROM purging WHERE run_id = OLD.run_id)
    BEGIN SELECT RAISE(ABORT, 'the usage ledger is append-only'); END;
DROP TRIGGER events_no_delete;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    WHEN NOT EXISTS (SELECT 1 FROM purging WHERE run_id = OLD.run_id)
    BEGIN SELECT RAISE(ABORT, 'the events journal is append-only'); END;
