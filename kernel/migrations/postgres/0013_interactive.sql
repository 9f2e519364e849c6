-- version 13 (PostgreSQL dialect of ../0013_interactive.sql): interactive
-- operations (SPEC §25). How an op's stdin is wired: NULL (stdin is
-- /dev/null, every op before this version), `pipe`, or `tty:<rows>x<cols>`
-- (a terminal of that size at its start).
ALTER TABLE ops ADD COLUMN io TEXT;
