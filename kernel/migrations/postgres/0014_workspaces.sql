-- version 14 (PostgreSQL dialect of ../0014_workspaces.sql): workspaces
-- (SPEC §26). A run's image by the operator's name for it (NULL: the
-- kernel's default), and the named snapshots of run workspaces.
ALTER TABLE runs ADD COLUMN image TEXT;
CREATE TABLE snapshots (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, name)
);
