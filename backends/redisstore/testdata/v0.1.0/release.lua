-- Releases the lease on KEYS[1] if ARGV owner and token still hold it, and
-- wakes the key's watchers (see complete.lua). The record, with its
-- fencing token, is kept for its retention.
-- ARGV: owner, token. Returns 1, or 0 if the lease is lost.
local r = redis.call('HMGET', KEYS[1], 's', 'o', 't', 'r')
if r[1] ~= '1' or r[2] ~= ARGV[1] or r[3] ~= ARGV[2] then
  return 0
end
local retention = tonumber(r[4])
if retention <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 's', 2)
  redis.call('PEXPIRE', KEYS[1], retention)
end
pcall(redis.call, 'SPUBLISH', KEYS[1], '')
return 1
