-- Marks KEYS[1] completed if ARGV owner and token still hold its lease,
-- keeping the record for the retention it was acquired with, and wakes
-- the key's watchers: a message on the sharded channel named as the key
-- (ignored by a server without sharded pub/sub).
-- ARGV: owner, token, output. Returns 1, or 0 if lost.
local r = redis.call('HMGET', KEYS[1], 's', 'o', 't', 'r')
if r[1] ~= '1' or r[2] ~= ARGV[1] or r[3] ~= ARGV[2] then
  return 0
end
local retention = tonumber(r[4])
if retention <= 0 then
  redis.call('DEL', KEYS[1])
else
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if ARGV[3] == '' then
    redis.call('HSET', KEYS[1], 's', 3, 'ca', now)
  else
    redis.call('HSET', KEYS[1], 's', 3, 'ca', now, 'out', ARGV[3])
  end
  redis.call('PEXPIRE', KEYS[1], retention)
end
pcall(redis.call, 'SPUBLISH', KEYS[1], '')
return 1
