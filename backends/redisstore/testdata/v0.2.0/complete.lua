-- Marks KEYS[1] completed if the lease of ARGV[1] still holds it, keeping
-- the record for the retention it was acquired with, and wakes the key's
-- watchers: a message on the sharded channel named as the key (ignored by
-- a server without sharded pub/sub). See acquire.lua for the record;
-- acquired.lua comes before this script.
-- ARGV: 'p' .. token .. ':' .. owner .. '\0' (the start of the holder's
-- record), output. Returns 1, or 0 if the lease is lost.
local h = ARGV[1]
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
  if redis.call('TYPE', KEYS[1]).ok == 'hash' then
    return 0 -- a record of 0.1.0, which no lease of this version holds
  end
  return v
end
if not v or string.sub(v, 1, #h) ~= h then
  return 0
end
local i = string.find(v, ':', #h + 1, true)
local j = string.find(v, ':', i + 1, true)
local retention = string.sub(v, i + 1, j - 1)
if retention == '0' then
  redis.call('DEL', KEYS[1])
else
  local k = string.find(v, ':', j + 1, true)
  local acquired = acquiredAt(v, j + 1, k - 1, retention)
  local t = redis.call('TIME')
  redis.call('SET', KEYS[1], 'c' .. string.sub(v, 2, j) .. acquired .. string.sub(v, k) .. t[1] .. ':' .. t[2] .. ':' .. ARGV[2], 'PX', retention)
end
pcall(redis.call, 'SPUBLISH', KEYS[1], '')
return 1
