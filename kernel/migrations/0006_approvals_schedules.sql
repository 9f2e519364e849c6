-- version 6: approval gates (SPEC §16) and schedules (SPEC §15), and what
-- a review of version 5 added: who paused a run, a child's creation key,
-- the events journal's delete guard and the durable kill intent.
ALTER TABLE runs ADD COLUMN paused_by TEXT;                          -- who paused it (may resume it, with those above)
ALTER TABLE runs ADD COLUMN idempotency_key TEXT;                    -- a child's creation key: a retry under it re-keys
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'the events journal is append-only'); END;
-- a kill signal was about to be sent (written before the first signal): a
-- TERM or KILL death after it is the kill's, even if the kernel died
-- before it could record that the signal landed (kill_signalled)
ALTER TABLE ops ADD COLUMN kill_intent INTEGER NOT NULL DEFAULT 0;
--
-- The ops table is rebuilt for its status CHECK to hold the two new
-- statuses: awaiting_approval (not terminal; nothing claimed or executed)
-- and denied (terminal; nothing ran). Every column and row is kept.
CREATE TABLE ops_v6 (
    id                    TEXT PRIMARY KEY,
    run_id                TEXT NOT NULL,
    command               TEXT NOT NULL,
    background            INTEGER NOT NULL,
    timeout_sec           INTEGER NOT NULL,
    status                TEXT NOT NULL CHECK (status IN ('awaiting_approval','starting','running','completed','timed_out','lost','failed','denied')),
    attempt               INTEGER NOT NULL DEFAULT 0,
    failed_attempts       INTEGER NOT NULL DEFAULT 0,
    exec_claimed_at       INTEGER,
    scratch_key           TEXT NOT NULL,
    container_id          TEXT,
    pid                   INTEGER,
    proc_start_ticks      INTEGER,
    hostname              TEXT,
    created_at            INTEGER NOT NULL,
    started_at            INTEGER,
    heartbeat_at          INTEGER,
    finished_at           INTEGER,
    exit_code             INTEGER,
    killed                INTEGER NOT NULL DEFAULT 0,
    kill_requested_at     INTEGER,
    kill_reason           TEXT,
    effect                TEXT,
    error                 TEXT,
    output_tail           TEXT,
    log_sha256            TEXT,
    log_size              INTEGER,
    kernel_id             TEXT,
    idempotency_key       TEXT,
    request_sha256        TEXT,
    report_id             TEXT,
    delivered_inline      INTEGER NOT NULL DEFAULT 0,
    kill_signalled        INTEGER NOT NULL DEFAULT 0,
    exec_id               TEXT,
    cpu_ms                INTEGER,
    max_rss_kb            INTEGER,
    handed_over_at        INTEGER,
    kill_intent           INTEGER NOT NULL DEFAULT 0,
    -- the approval hold: the rule that matched, what its timeout does, and
    -- the decision (by 'operator', 'timeout' or 'kill')
    approval_rule         TEXT,
    approval_timeout_sec  INTEGER,
    approval_on_timeout   TEXT CHECK (approval_on_timeout IN ('escalate','deny')),
    approval_escalated_at INTEGER,
    approval_decided_by   TEXT,
    approval_decided_at   INTEGER,
    -- the schedule that fired it, when one did
    schedule_id           TEXT
);
INSERT INTO ops_v6 (id, run_id, command, background, timeout_sec, status, attempt, failed_attempts,
    exec_claimed_at, scratch_key, container_id, pid, proc_start_ticks, hostname, created_at, started_at,
    heartbeat_at, finished_at, exit_code, killed, kill_requested_at, kill_reason, effect, error,
    output_tail, log_sha256, log_size, kernel_id, idempotency_key, request_sha256, report_id,
    delivered_inline, kill_signalled, exec_id, cpu_ms, max_rss_kb, handed_over_at, kill_intent)
SELECT id, run_id, command, background, timeout_sec, status, attempt, failed_attempts,
    exec_claimed_at, scratch_key, container_id, pid, proc_start_ticks, hostname, created_at, started_at,
    heartbeat_at, finished_at, exit_code, killed, kill_requested_at, kill_reason, effect, error,
    output_tail, log_sha256, log_size, kernel_id, idempotency_key, request_sha256, report_id,
    delivered_inline, kill_signalled, exec_id, cpu_ms, max_rss_kb, handed_over_at, kill_intent
FROM ops;
DROP TABLE ops;
ALTER TABLE ops_v6 RENAME TO ops;
CREATE INDEX ops_by_run ON ops (run_id, status);
CREATE INDEX ops_live ON ops (status) WHERE status IN ('awaiting_approval','starting','running');
CREATE UNIQUE INDEX ops_idempotency ON ops (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX ops_undelivered ON ops (run_id) WHERE report_id IS NULL AND delivered_inline = 0;
CREATE INDEX ops_waiting ON ops (created_at) WHERE status = 'awaiting_approval';
-- what observers watch (recovery, heartbeats, kill requests) has its own index
CREATE INDEX ops_observed ON ops (status) WHERE status IN ('starting','running');

-- schedules: owned by a run and firing as it. `next_due_at` is the next due
-- time; a claim (claimed_at, claimed_by) is taken in the transaction that
-- inserts the due time's op (idempotency key: schedule id + due time) and
-- held until that op settles, whose transaction finalizes the schedule.
CREATE TABLE schedules (
    id                   TEXT PRIMARY KEY,
    run_id               TEXT NOT NULL,
    command              TEXT NOT NULL,           -- JSON argv
    timeout_sec          INTEGER NOT NULL,
    kind                 TEXT NOT NULL CHECK (kind IN ('cron','every','at')),
    spec                 TEXT NOT NULL,           -- the cron expression, seconds, or RFC 3339 time
    catch_up             INTEGER NOT NULL DEFAULT 0,
    delete_after_success INTEGER NOT NULL DEFAULT 0,
    enabled              INTEGER NOT NULL DEFAULT 1,   -- 0: a finished one-shot
    paused               INTEGER NOT NULL DEFAULT 0,
    next_due_at          INTEGER,                 -- unix ms; NULL when it will not fire again
    claimed_at           INTEGER,
    claimed_by           TEXT,
    current_op_id        TEXT,
    current_due_at       INTEGER,
    last_due_at          INTEGER,
    last_op_id           TEXT,
    last_status          TEXT,
    last_exit_code       INTEGER,
    last_output_tail     TEXT,                    -- at most 4 KiB
    last_finished_at     INTEGER,
    created_at           INTEGER NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_due_at) WHERE enabled = 1 AND paused = 0 AND claimed_at IS NULL;
CREATE INDEX schedules_by_run ON schedules (run_id);
CREATE UNIQUE INDEX schedules_current_op ON schedules (current_op_id) WHERE current_op_id IS NOT NULL;
