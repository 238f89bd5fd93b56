-- Marks KEYS[1] completed if the lease of ARGV[1] still holds it, keeping
-- the record for the retention it was acquired with, and wakes the key's
-- watchers. See acquire.lua for the record; prelude.lua comes before this
-- script.
-- ARGV: the start of the holder's record (see held in prelude.lua),
-- output. Returns 1, or 0 if the lease is lost.
local lost, v, j, retention = held(ARGV[1])
if lost then
  return lost
end
return ended(v, j, retention, ARGV[2])
