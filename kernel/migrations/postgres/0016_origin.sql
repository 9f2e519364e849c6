-- version 16 (PostgreSQL dialect of ../0016_origin.sql): trusted origin
-- (SPEC §28): where each run and op came from,
-- recorded at admission from the call's context. NULL for rows admitted
-- before this version.
ALTER TABLE ops ADD COLUMN origin_surface TEXT;
ALTER TABLE ops ADD COLUMN origin_channel TEXT;
ALTER TABLE ops ADD COLUMN origin_principal TEXT;
ALTER TABLE ops ADD COLUMN origin_route TEXT;
ALTER TABLE runs ADD COLUMN origin_surface TEXT;
ALTER TABLE runs ADD COLUMN origin_channel TEXT;
ALTER TABLE runs ADD COLUMN origin_principal TEXT;
ALTER TABLE runs ADD COLUMN origin_route TEXT;
