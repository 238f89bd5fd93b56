-- Releases the lease on KEYS[1] if the lease of ARGV[1] still holds it,
-- and wakes the key's watchers (see complete.lua). The record, with its
-- fencing token, is kept for its retention. acquired.lua comes before this
-- script.
-- ARGV: the start of the holder's record (see complete.lua). Returns 1,
-- or 0 if the lease is lost.
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
local j = string.find(v, ':', i + 1, true)
local retention = string.sub(v, i + 1, j - 1)
if retention == '0' then
  redis.call('DEL', KEYS[1])
else
  local k = string.find(v, ':', j + 1, true)
  local acquired = acquiredAt(v, j + 1, k - 1, retention)
  redis.call('SET', KEYS[1], 'r' .. string.sub(v, 2, j) .. acquired .. string.sub(v, k), 'PX', retention)
end
pcall(redis.call, 'SPUBLISH', KEYS[1], '')
return 1
