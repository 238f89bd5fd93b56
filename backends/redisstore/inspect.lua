-- Returns {layout, seconds, microseconds, expiry, ...} for KEYS[1], with
-- the server's time and the key's expiry (ms since the epoch, -1 for
-- none), or false if it has no record: layout 2 is followed by the record
-- (see acquire.lua), layout 1 (0.1.0's hash) by field, value, ...
-- prelude.lua comes before this script.
-- ARGV: none for the whole record, or 'header' for what Count needs and
-- no more: the record's first 512 bytes (they hold its state, token,
-- owner, attempt, retention and acquisition time), or the hash's s and le
-- fields.
local t = redis.call('TIME')
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  return false
end
local out = {2, t[1], t[2], expiresAt(t)}
local header = ARGV[1] == 'header'
if kind == 'hash' then
  out[1] = 1
  if header then
    local f = redis.call('HMGET', KEYS[1], 's', 'le')
    out[5], out[6], out[7], out[8] = 's', f[1], 'le', f[2]
    return out
  end
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields do
    out[#out + 1] = fields[i]
  end
  return out
end
if header then
  out[5] = redis.call('GETRANGE', KEYS[1], 0, 511) -- WRONGTYPE for a key of another type
else
  out[5] = redis.call('GET', KEYS[1]) -- WRONGTYPE for a key of another type
end
return out
