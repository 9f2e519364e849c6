-- opkernel control plane, version 1. The single authority on every op's lifecycle.
CREATE TABLE runs (
    run_id        TEXT PRIMARY KEY,
    token_sha256  TEXT UNIQUE,
    created_at    INTEGER NOT NULL,
    finished_at   INTEGER
);

CREATE TABLE ops (
    id                TEXT PRIMARY KEY,
    run_id            TEXT NOT NULL,
    command           TEXT NOT NULL,          -- JSON argv
    background        INTEGER NOT NULL,
    timeout_sec       INTEGER NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('starting','running','completed','timed_out','lost','failed')),
    attempt           INTEGER NOT NULL DEFAULT 0,
    failed_attempts   INTEGER NOT NULL DEFAULT 0,
    exec_claimed_at   INTEGER,                -- set once, before the only exec is created
    scratch_key       TEXT NOT NULL,
    container_id      TEXT,
    pid               INTEGER,
    proc_start_ticks  INTEGER,
    hostname          TEXT,
    created_at        INTEGER NOT NULL,       -- all times: unix milliseconds
    started_at        INTEGER,
    heartbeat_at      INTEGER,
    finished_at       INTEGER,
    exit_code         INTEGER,
    killed            INTEGER NOT NULL DEFAULT 0,
    kill_requested_at INTEGER,
    kill_reason       TEXT,
    effect            TEXT,
    error             TEXT,
    output_tail       TEXT,
    log_sha256        TEXT,
    log_size          INTEGER,
    kernel_id         TEXT,
    idempotency_key   TEXT,
    request_sha256    TEXT,
    report_id         TEXT,                   -- delivery mark
    delivered_inline  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX ops_by_run ON ops (run_id, status);
CREATE INDEX ops_live ON ops (status) WHERE status IN ('starting','running');
CREATE UNIQUE INDEX ops_idempotency ON ops (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE reports (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    acked_at    INTEGER,
    body        TEXT NOT NULL                 -- the report as served, JSON
);
CREATE INDEX reports_unacked ON reports (run_id) WHERE acked_at IS NULL;

CREATE TABLE notes (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    text        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    report_id   TEXT
);
CREATE INDEX notes_pending ON notes (run_id) WHERE report_id IS NULL;

CREATE TABLE kernels (
    id          TEXT PRIMARY KEY,             -- boot id + pid + process start time
    started_at  INTEGER NOT NULL
);
