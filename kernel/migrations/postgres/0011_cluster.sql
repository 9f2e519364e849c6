-- version 11 (PostgreSQL dialect of ../0011_cluster.sql): the cluster's
-- membership and placement.
CREATE TABLE nodes (
    name          TEXT PRIMARY KEY,
    advertise_url TEXT NOT NULL,
    epoch         BIGINT NOT NULL,
    lease_until   BIGINT NOT NULL,
    renewed_at    BIGINT NOT NULL,
    joined_at     BIGINT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('active', 'draining', 'dead')),
    containers    BIGINT NOT NULL DEFAULT 0,
    pool_free     BIGINT NOT NULL DEFAULT 0
);
ALTER TABLE runs ADD COLUMN node TEXT;
ALTER TABLE ops ADD COLUMN node TEXT;
CREATE INDEX ops_by_node ON ops (node, status);
