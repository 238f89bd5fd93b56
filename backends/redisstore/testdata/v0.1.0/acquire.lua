-- Takes the processing lease on KEYS[1], or says why not.
-- ARGV: owner, lease TTL (ms), retention (ms), fingerprint ('' for none).
-- Returns one of:
--   {1, token, attempt, flags, fingerprint}  acquired; flags: 1 takeover, 2 re-entrant
--   {2, remaining ms, fingerprint}           in progress under another owner
--   {3, completed at (ms), fingerprint, output}
-- The record is a hash: s state (1 in progress, 2 released, 3 completed),
-- o owner, t fencing token, a attempt, le lease expiry (ms), r retention (ms),
-- ca completed at (ms), f fingerprint, out output. Times are the server's.
local key = KEYS[1]
local owner, ttl, retention, fp = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local r = redis.call('HMGET', key, 's', 'o', 't', 'a', 'le', 'f')
local state, stored_fp = r[1], r[6]
if not stored_fp and fp ~= '' then
  -- The record adopts the first fingerprint it is given, whatever happens next.
  stored_fp = fp
  redis.call('HSET', key, 'f', fp)
end

if state == '3' then
  local c = redis.call('HMGET', key, 'ca', 'out')
  return {3, tonumber(c[1]), stored_fp or false, c[2] or false}
end

local token, attempt, flags
if state == '1' and r[2] == owner then
  token, attempt, flags = tonumber(r[3]), tonumber(r[4]), 2
elseif state == '1' and tonumber(r[5]) > now then
  return {2, tonumber(r[5]) - now, stored_fp or false}
else
  token, attempt, flags = (tonumber(r[3]) or 0) + 1, (tonumber(r[4]) or 0) + 1, 0
  if state == '1' then
    flags = 1
  end
end

redis.call('HSET', key, 's', 1, 'o', owner, 't', token, 'a', attempt, 'le', now + ttl, 'r', retention)
redis.call('PEXPIRE', key, ttl + retention)
return {1, token, attempt, flags, stored_fp or false}
