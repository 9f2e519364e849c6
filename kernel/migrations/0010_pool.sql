-- version 10: the warm pool's bindings (SPEC §22). A run that adopted a
-- pool container is bound to it here, in one transaction; the binding file
-- (the run's scratch path, a symlink to the pool container's dir) mirrors
-- it on the host. A container serves one run for its whole life: both
-- columns are unique, and a binding is never moved.
CREATE TABLE container_bindings (
    run_id       TEXT PRIMARY KEY,
    container_id TEXT NOT NULL UNIQUE,
    scratch_key  TEXT NOT NULL UNIQUE,
    bound_at     INTEGER NOT NULL
);
