-- Prepended to acquire.lua and inspect.lua: the local functions they
-- share, on the record of KEYS[1] (see acquire.lua for its layout). Redis
-- runs a script as one function, so these are locals, defined again each
-- time the script runs; lease.lua and take.lua, which run for every
-- message, do without them.

-- millis returns the time t (a reply of TIME) in ms since the epoch.
local function millis(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- expiresAt returns when KEYS[1] expires, ms since the epoch by the
-- server's clock, or -1 if it never does (-2 if there is no key). t is the
-- server's time if the script has read it already: a server before Redis
-- 7.0, without PEXPIRETIME, needs it.
local function expiresAt(t)
  local at = redis.pcall('PEXPIRETIME', KEYS[1]) -- Redis 7.0 and later
  if type(at) ~= 'number' then
    t = t or redis.call('TIME')
    at = redis.call('PTTL', KEYS[1])
    if at >= 0 then
      at = millis(t) + at
    end
  end
  return at
end

-- acquiredAt returns the acquisition time of the record v whose retention
-- is the string retention and whose acquired field is at positions i to
-- j: the field itself if it is a time already (or empty), else, while it
-- is '~' and the lease TTL, the key's expiry less the retention less the
-- TTL. A script that ends or extends a lease or takes it again writes it
-- so before it moves that expiry.
local function acquiredAt(v, i, j, retention)
  if string.byte(v, i) ~= 126 then -- '~'
    return string.sub(v, i, j)
  end
  local at = expiresAt()
  if at < 0 then
    return ''
  end
  return string.format('%d', at - tonumber(retention) - tonumber(string.sub(v, i + 1, j)))
end
