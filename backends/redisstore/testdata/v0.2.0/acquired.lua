-- Prepended to the scripts that end or extend a lease or take it again
-- (acquire.lua, renew.lua, complete.lua, release.lua): a record's acquired
-- field, '~' and the lease TTL while the key's expiry still is the one the
-- lease was taken with, turned into the time of the acquisition (ms since
-- the epoch, by the server's clock) before that expiry moves. See
-- acquire.lua for the record.

-- acquiredAt returns the acquisition time of the record v of KEYS[1] whose
-- retention is the string retention and whose acquired field is a at
-- positions i to j: a itself if it is a time already (or empty), else the
-- key's expiry less the retention less the TTL.
local function acquiredAt(v, i, j, retention)
  if string.byte(v, i) ~= 126 then -- '~'
    return string.sub(v, i, j)
  end
  local at = redis.pcall('PEXPIRETIME', KEYS[1]) -- Redis 7.0 and later
  if type(at) ~= 'number' then
    local t = redis.call('TIME')
    at = redis.call('PTTL', KEYS[1])
    if at >= 0 then
      at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + at
    end
  end
  if at < 0 then
    return ''
  end
  return string.format('%d', at - tonumber(retention) - tonumber(string.sub(v, i + 1, j)))
end

