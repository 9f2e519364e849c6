-- version 6 (PostgreSQL dialect of ../0006_approvals_schedules.sql):
-- approval gates and schedules. SQLite rebuilds the ops table for its
-- status CHECK; here the constraint is replaced in place.
ALTER TABLE runs ADD COLUMN paused_by TEXT;
ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION opkernel_append_only('the events journal is append-only');
ALTER TABLE ops ADD COLUMN kill_intent INTEGER NOT NULL DEFAULT 0;

ALTER TABLE ops DROP CONSTRAINT ops_status;
ALTER TABLE ops ADD CONSTRAINT ops_status
    CHECK (status IN ('awaiting_approval','starting','running','completed','timed_out','lost','failed','denied'));
ALTER TABLE ops ADD COLUMN approval_rule TEXT;
ALTER TABLE ops ADD COLUMN approval_timeout_sec BIGINT;
ALTER TABLE ops ADD COLUMN approval_on_timeout TEXT CHECK (approval_on_timeout IN ('escalate','deny'));
ALTER TABLE ops ADD COLUMN approval_escalated_at BIGINT;
ALTER TABLE ops ADD COLUMN approval_decided_by TEXT;
ALTER TABLE ops ADD COLUMN approval_decided_at BIGINT;
ALTER TABLE ops ADD COLUMN schedule_id TEXT;
DROP INDEX ops_live;
CREATE INDEX ops_live ON ops (status) WHERE status IN ('awaiting_approval','starting','running');
CREATE INDEX ops_waiting ON ops (created_at) WHERE status = 'awaiting_approval';
CREATE INDEX ops_observed ON ops (status) WHERE status IN ('starting','running');

CREATE TABLE schedules (
    id                   TEXT PRIMARY KEY,
    run_id               TEXT NOT NULL,
    command              TEXT NOT NULL,
    timeout_sec          BIGINT NOT NULL,
    kind                 TEXT NOT NULL CHECK (kind IN ('cron','every','at')),
    spec                 TEXT NOT NULL,
    catch_up             INTEGER NOT NULL DEFAULT 0,
    delete_after_success INTEGER NOT NULL DEFAULT 0,
    enabled              INTEGER NOT NULL DEFAULT 1,
    paused               INTEGER NOT NULL DEFAULT 0,
    next_due_at          BIGINT,
    claimed_at           BIGINT,
    claimed_by           TEXT,
    current_op_id        TEXT,
    current_due_at       BIGINT,
    last_due_at          BIGINT,
    last_op_id           TEXT,
    last_status          TEXT,
    last_exit_code       INTEGER,
    last_output_tail     TEXT,
    last_finished_at     BIGINT,
    created_at           BIGINT NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_due_at) WHERE enabled = 1 AND paused = 0 AND claimed_at IS NULL;
CREATE INDEX schedules_by_run ON schedules (run_id);
CREATE UNIQUE INDEX schedules_current_op ON schedules (current_op_id) WHERE current_op_id IS NOT NULL;
