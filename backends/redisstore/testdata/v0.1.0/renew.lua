-- Extends the lease on KEYS[1] if ARGV owner and token still hold it.
-- ARGV: owner, token, lease TTL (ms). Returns 1, or 0 if the lease is lost.
local r = redis.call('HMGET', KEYS[1], 's', 'o', 't', 'r')
if r[1] ~= '1' or r[2] ~= ARGV[1] or r[3] ~= ARGV[2] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'le', now + ttl)
redis.call('PEXPIRE', KEYS[1], ttl + tonumber(r[4]))
return 1
