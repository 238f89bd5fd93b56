-- Returns {now (ms), record TTL (ms), field, value, ...} for KEYS[1], or
-- false if it has no record.
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then
  return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now, redis.call('PTTL', KEYS[1])}
for i = 1, #fields do
  out[#out + 1] = fields[i]
end
return out
