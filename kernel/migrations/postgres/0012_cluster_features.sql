-- version 12 (PostgreSQL dialect of ../0012_cluster_features.sql): the features that hold together in a cluster (SPEC §24).
-- A pool binding names the node whose engine and disk hold its container
-- and scratch (NULL: a single kernel's); a node recovers, reconciles, reaps
-- and unbinds only its own.
ALTER TABLE container_bindings ADD COLUMN node TEXT;
-- The webhook outbox is the cluster's: a due post is taken by one node at
-- a time (taken_by until taken_until, on the writer's clock), so every
-- node may deliver and each post goes out once in the normal case.
ALTER TABLE webhook_outbox ADD COLUMN taken_by TEXT;
ALTER TABLE webhook_outbox ADD COLUMN taken_until BIGINT;
-- Settings every node of a cluster must share (the webhook's URL and a
-- digest of its secret): the first node to join records them; a node
-- started with others is refused while another live node holds them.
CREATE TABLE cluster_settings (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    node       TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);
