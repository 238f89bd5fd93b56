-- Prepended to every script but delete.lua: the local functions the
-- scripts share, on the record of KEYS[1] (see acquire.lua for its
-- layout). Redis runs a script as one function, so these are locals,
-- defined again each time the script runs; a script that does not call
-- one only pays for its definition.

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

-- held reads the record of KEYS[1] for renew.lua, complete.lua and
-- release.lua, which act only while the lease whose record starts with h
-- ('p' .. token .. ':' .. owner .. '\0', their ARGV[1]) still holds the
-- key. If it does not, held returns the script's reply: 0, or the error of
-- a key of another type. If it does, held returns nil, the record, the
-- position of the ':' that ends the record's retention, and the retention
-- (ms, a string).
local function held(h)
  local v = redis.pcall('GET', KEYS[1])
  if type(v) == 'table' then
    if redis.call('TYPE', KEYS[1]).ok == 'hash' then
      return 0 -- a record of 0.1.0, which no lease of this version holds
    end
    return v -- WRONGTYPE: someone else's data under the prefix
  end
  if not v or string.sub(v, 1, #h) ~= h then
    return 0
  end
  local i = string.find(v, ':', #h + 1, true)
  local j = string.find(v, ':', i + 1, true)
  return nil, v, j, string.sub(v, i + 1, j - 1)
end

-- settled returns the record v that held returned, j and retention as it
-- returned them, without its state byte and with its acquired field a
-- time (acquiredAt): the record as a script writes it back.
local function settled(v, j, retention)
  local k = string.find(v, ':', j + 1, true)
  return string.sub(v, 2, j) .. acquiredAt(v, j + 1, k - 1, retention) .. string.sub(v, k)
end

-- ended ends the lease that holds the record v (held returned it, j and
-- retention): the record is kept for its retention in state 'r', released,
-- or, given the output, 'c', completed, with the server's time of the
-- completion; with no retention it is deleted. Then it wakes the key's
-- watchers: a message on the sharded channel named as the key (ignored by
-- a server without sharded pub/sub). It returns 1, the scripts' reply.
local function ended(v, j, retention, output)
  if retention == '0' then
    redis.call('DEL', KEYS[1])
  elseif output then
    local rec = settled(v, j, retention)
    local t = redis.call('TIME')
    redis.call('SET', KEYS[1], 'c' .. rec .. t[1] .. ':' .. t[2] .. ':' .. output, 'PX', retention)
  else
    redis.call('SET', KEYS[1], 'r' .. settled(v, j, retention), 'PX', retention)
  end
  pcall(redis.call, 'SPUBLISH', KEYS[1], '')
  return 1
end

