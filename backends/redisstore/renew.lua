-- Extends the lease on KEYS[1] if the lease of ARGV[1] still holds it:
-- the key then expires one retention after the new lease.
-- ARGV: the start of the holder's record (see complete.lua), lease TTL
-- (ms). Returns 1, or 0 if the lease is lost.
local h = ARGV[1]
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
  if redis.call('TYPE', KEYS[1]).ok == 'hash' then
    return 0
  end
  return v
end
if not v or string.sub(v, 1, #h) ~= h then
  return 0
end
local i = string.find(v, ':', #h + 1, true)
local retention = string.sub(v, i + 1, string.find(v, ':', i + 1, true) - 1)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + tonumber(retention))
return 1
