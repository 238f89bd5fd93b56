-- Extends the lease on KEYS[1] if the lease of ARGV[1] still holds it:
-- the key then expires one retention after the new lease. The first
-- renewal of a lease writes its acquisition time (acquiredAt in
-- prelude.lua, which comes before this script) before it moves the key's
-- expiry.
-- ARGV: the start of the holder's record (see held in prelude.lua), lease
-- TTL (ms). Returns 1, or 0 if the lease is lost.
local lost, v, j, retention = held(ARGV[1])
if lost then
  return lost
end
local px = tonumber(ARGV[2]) + tonumber(retention)
if string.byte(v, j + 1) == 126 then -- '~': acquired still relative to the expiry
  redis.call('SET', KEYS[1], 'p' .. settled(v, j, retention), 'PX', px)
else
  redis.call('PEXPIRE', KEYS[1], px)
end
return 1
