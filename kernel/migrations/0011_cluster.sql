-- version 11: the cluster's membership and placement (SPEC §20). A node is
-- a lease row: its kernel renews `lease_until` (milliseconds on the
-- database's clock) every TTL/5; any node's sweeper marks a lapsed one
-- `dead` with a new epoch and settles its ops. A top-level run is placed on
-- a node when first used (`runs.node`); each op records the node it was
-- placed on (`ops.node`), which alone may claim and run it, fenced by the
-- node's epoch inside the claim statement. Empty without a cluster.
CREATE TABLE nodes (
    name          TEXT PRIMARY KEY,
    advertise_url TEXT NOT NULL,
    epoch         INTEGER NOT NULL,
    lease_until   INTEGER NOT NULL,
    renewed_at    INTEGER NOT NULL,
    joined_at     INTEGER NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('active', 'draining', 'dead')),
    containers    INTEGER NOT NULL DEFAULT 0,
    -- free warm-pool containers at its last renewal: placement prefers a
    -- node with one (SPEC §22)
    pool_free     INTEGER NOT NULL DEFAULT 0
);
ALTER TABLE runs ADD COLUMN node TEXT;
ALTER TABLE ops ADD COLUMN node TEXT;
-- a node's ops by status: placement counts the live ones, recovery and
-- hand-off take them, a node back from the dead looks up those it lost
CREATE INDEX ops_by_node ON ops (node, status);
