-- Extends the lease on KEYS[1] if the lease of ARGV[1] still holds it:
-- the key then expires one retention after the new lease. The first
-- renewal of a lease writes its acquisition time (acquired.lua, which
-- comes before this script) before it moves the key's expiry.
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
local j = string.find(v, ':', i + 1, true)
local retention = string.sub(v, i + 1, j - 1)
local px = tonumber(ARGV[2]) + tonumber(retention)
if string.byte(v, j + 1) == 126 then -- '~': acquired still relative to the expiry
  local k = string.find(v, ':', j + 1, true)
  redis.call('SET', KEYS[1], string.sub(v, 1, j) .. acquiredAt(v, j + 1, k - 1, retention) .. string.sub(v, k), 'PX', px)
else
  redis.call('PEXPIRE', KEYS[1], px)
end
return 1
