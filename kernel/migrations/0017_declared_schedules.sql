-- version 17: declared schedules (SPEC §28). A schedule from the
-- operator's file (OPKERNEL_SCHEDULES) carries its key in that file and
-- the file's path; the files reconciled, by content, record which one the
-- control plane follows (the newest) and which it followed before (a
-- node starting with one of those is not applied: it is older; a file's
-- optional version orders files whatever node starts first).
ALTER TABLE schedules ADD COLUMN declared_key TEXT;
ALTER TABLE schedules ADD COLUMN declared_in TEXT;
CREATE UNIQUE INDEX schedules_declared ON schedules (declared_key) WHERE declared_key IS NOT NULL;
CREATE TABLE declared_files (
    sha256          TEXT PRIMARY KEY,
    path            TEXT NOT NULL,
    applied_at      INTEGER NOT NULL,
    applied_by      TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    version         INTEGER
);
