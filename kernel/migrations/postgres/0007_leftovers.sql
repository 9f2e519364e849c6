-- version 7 (PostgreSQL dialect of ../0007_leftovers.sql)
ALTER TABLE ops ADD COLUMN leftovers INTEGER NOT NULL DEFAULT 0;
