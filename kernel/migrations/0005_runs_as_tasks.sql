-- version 5: runs as durable tasks (SPEC §14). A run record carries its
-- parent, chain, principal, state, envelope and budget; the usage ledger and
-- the events journal are append-only. Remaining budget is never stored: it
-- is derived from the ledger every time.
ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
ALTER TABLE runs ADD COLUMN chain TEXT NOT NULL DEFAULT '[]';        -- JSON: ancestor run ids, root first
ALTER TABLE runs ADD COLUMN principal TEXT NOT NULL DEFAULT 'operator';  -- 'operator' or 'run:<creating run>'
ALTER TABLE runs ADD COLUMN state TEXT NOT NULL DEFAULT 'active'
    CHECK (state IN ('active','paused','completed','cancelled'));
ALTER TABLE runs ADD COLUMN envelope TEXT NOT NULL DEFAULT '{}';     -- JSON, resolved at creation ('{}': kernel defaults)
ALTER TABLE runs ADD COLUMN budget TEXT NOT NULL DEFAULT '{}';       -- JSON limits, any subset
ALTER TABLE runs ADD COLUMN state_changed_at INTEGER;
ALTER TABLE runs ADD COLUMN summary TEXT;                            -- the completion decision
ALTER TABLE runs ADD COLUMN decided_by TEXT;                         -- who completed or cancelled it
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

-- every (run, ancestor) pair, the run itself included at distance 0: "the
-- run and its descendants" is one indexed lookup
CREATE TABLE run_ancestry (
    run_id      TEXT NOT NULL,
    ancestor_id TEXT NOT NULL,
    distance    INTEGER NOT NULL,
    PRIMARY KEY (ancestor_id, run_id)
) WITHOUT ROWID;
INSERT INTO run_ancestry (run_id, ancestor_id, distance) SELECT run_id, run_id, 0 FROM runs;

-- the usage ledger: one fact per settled op (source 'op', wall and CPU
-- milliseconds) or per model call reported by the agent runtime
-- (source 'model'); never updated, never deleted
CREATE TABLE usage (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          TEXT NOT NULL,
    at              INTEGER NOT NULL,
    source          TEXT NOT NULL CHECK (source IN ('op','model')),
    operation_id    TEXT UNIQUE,
    model           TEXT,
    op_ms           INTEGER NOT NULL DEFAULT 0,
    cpu_ms          INTEGER,                  -- NULL: not measured (never invented)
    input_tokens    INTEGER NOT NULL DEFAULT 0,
    output_tokens   INTEGER NOT NULL DEFAULT 0,
    cost_micros     INTEGER NOT NULL DEFAULT 0,
    idempotency_key TEXT,
    request_sha256  TEXT
);
CREATE INDEX usage_by_run ON usage (run_id);
CREATE UNIQUE INDEX usage_idempotency ON usage (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE TRIGGER usage_no_update BEFORE UPDATE ON usage
    BEGIN SELECT RAISE(ABORT, 'the usage ledger is append-only'); END;
CREATE TRIGGER usage_no_delete BEFORE DELETE ON usage
    BEGIN SELECT RAISE(ABORT, 'the usage ledger is append-only'); END;

-- the run's trace: written in the transaction of the change it records
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL,
    at           INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    operation_id TEXT,
    data         TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_by_run ON events (run_id, seq);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'the events journal is append-only'); END;
