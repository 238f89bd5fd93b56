-- Returns {layout, seconds, microseconds, expiry, ...} for KEYS[1], with
-- the server's time and the key's expiry (ms since the epoch, -1 for
-- none), or false if it has no record: layout 2 is followed by the record
-- (see acquire.lua), layout 1 (0.1.0's hash) by field, value, ...
-- prelude.lua comes before this script.
local t = redis.call('TIME')
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  return false
end
local out = {2, t[1], t[2], expiresAt(t)}
if kind == 'hash' then
  out[1] = 1
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields do
    out[#out + 1] = fields[i]
  end
  return out
end
out[5] = redis.call('GET', KEYS[1]) -- WRONGTYPE for a key of another type
return out
