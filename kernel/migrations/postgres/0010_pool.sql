-- version 10 (PostgreSQL dialect of ../0010_pool.sql): the warm pool's
-- bindings.
CREATE TABLE container_bindings (
    run_id       TEXT PRIMARY KEY,
    container_id TEXT NOT NULL UNIQUE,
    scratch_key  TEXT NOT NULL UNIQUE,
    bound_at     BIGINT NOT NULL
);
