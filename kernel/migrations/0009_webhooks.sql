-- version 9: the webhook outbox (SPEC §23). With OPKERNEL_WEBHOOK_URL set,
-- every notified event (approval.requested, approval.escalated,
-- tool.completed, tool.failed, run.paused, run.resumed, run.completed,
-- run.cancelled) also puts its signed post here, in the event's own
-- transaction. The deliverer posts each run's rows in id order, each once
-- the one before was taken, retries with backoff, and deletes a row once
-- the receiver took it: at least once, in order per run, across restarts.
CREATE TABLE webhook_outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id TEXT NOT NULL UNIQUE,
    run_id      TEXT NOT NULL,
    kind        TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_at     INTEGER NOT NULL,
    last_error  TEXT
);
-- a run's rows in order, and whether one of them waits (next_at)
CREATE INDEX webhook_outbox_by_run ON webhook_outbox (run_id, next_at, id);
-- the due rows: a failed post pushes its whole run's next_at back, so rows
-- waiting behind a failing head are not scanned until it is due again
CREATE INDEX webhook_outbox_due ON webhook_outbox (next_at);
