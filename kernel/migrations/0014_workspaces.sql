-- version 14: workspaces (SPEC §26). A run's image, by the operator's name
-- for it (NULL: the kernel's default image, every run before this
-- version), and the named snapshots of run workspaces: their size counts
-- against the tree's disk_bytes, and they go with their tree's purge.
ALTER TABLE runs ADD COLUMN image TEXT;
CREATE TABLE snapshots (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, name)
);
