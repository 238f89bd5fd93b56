-- Releases the lease on KEYS[1] if the lease of ARGV[1] still holds it,
-- and wakes the key's watchers. The record, with its fencing token, is
-- kept for its retention. prelude.lua comes before this script.
-- ARGV: the start of the holder's record (see held in prelude.lua).
-- Returns 1, or 0 if the lease is lost.
local lost, v, j, retention = held(ARGV[1])
if lost then
  return lost
end
return ended(v, j, retention)
