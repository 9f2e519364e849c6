-- version 15: egress allow-lists (SPEC §27). What the egress proxy counted
-- per run: one fact per flush (every few seconds) of the connections it
-- let through and their bytes (in: to the container). Summed into the
-- run's usage; gone with its tree's purge.
CREATE TABLE net_usage (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          TEXT NOT NULL,
    at              INTEGER NOT NULL,
    connections     INTEGER NOT NULL,
    bytes_in        INTEGER NOT NULL,
    bytes_out       INTEGER NOT NULL
);
CREATE INDEX net_usage_run ON net_usage (run_id);
