-- version 4: when the kernel handed the op to its container's resident
-- launcher (the inbox request); NULL when it went by docker exec. Written in
-- the exec claim's own update, before the request file exists.
ALTER TABLE ops ADD COLUMN handed_over_at INTEGER;
