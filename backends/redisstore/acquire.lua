-- The fallback of Acquire, for what its fast path (SET NX PX GET, then
-- take.lua) cannot decide alone: takes the lease on KEYS[1], or says why
-- not.
-- ARGV: owner, lease TTL (ms), retention (ms), fingerprint ('' for none),
-- lease TTL + retention (ms), origin ('' for none).
-- Returns one of:
--   {1, record, flags}       acquired; flags: 1 takeover, 2 re-entrant
--   {2, record, remaining}   in progress under another owner; remaining ms
--   {3, record}              completed
-- with the record as it now is, in the layout below (a 0.1.0 hash is
-- answered in it too).
--
-- A record is one string:
--   state token ':' owner '\0' attempt ':' retention ':' acquired ':' origin '\0' #fp ':' fp
-- with state 'p' (leased: live or expired), 'r' (released) or 'c' (completed), and,
-- completed, followed by seconds ':' microseconds ':' output: the
-- server's time of the completion and the stored output. The key expires
-- one retention after the lease (PX lease TTL + retention), so the lease
-- is live while the key's PTTL exceeds the retention; released or
-- completed, one retention after that (PX retention). acquired is when
-- the lease was acquired, ms since the epoch, or, while the key's expiry
-- is still the one the lease was taken with, '~' and the lease TTL: the
-- acquisition was that expiry less the retention less the TTL, and
-- neither the client (Acquire's SET and take.lua) nor this script reads
-- the clock to write it. Renew, Complete, Release and a re-entrant Acquire
-- write the time before they move the expiry (lease.lua; acquiredAt in
-- prelude.lua); it is empty for a record taken over from 0.1.0, which did
-- not keep it. A completion's time is the completing holder's clock.
local key = KEYS[1]
local owner, ttl, retention, fp, px, origin = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]

-- A new lease: acquired '~' and the TTL, for SET PX px.
local function take(token, attempt, f, flags)
  local v = 'p' .. token .. ':' .. owner .. '\0' .. attempt .. ':' .. retention .. ':~' .. ttl .. ':' .. origin .. '\0' .. #f .. ':' .. f
  redis.call('SET', key, v, 'PX', px)
  return {1, v, flags}
end

local v = redis.pcall('GET', key)
if type(v) == 'table' then
  if redis.call('TYPE', key).ok ~= 'hash' then
    return v -- WRONGTYPE: someone else's data under the prefix
  end
  -- A record of 0.1.0: answered from the hash; a lease taken on it
  -- replaces it (SET) with a record in the new layout and the next
  -- fencing token.
  local now = millis(redis.call('TIME'))
  local r = redis.call('HMGET', key, 's', 'o', 't', 'a', 'le', 'f', 'r', 'ca', 'out')
  local state, f = r[1], r[6] or ''
  if f == '' and fp ~= '' then
    f = fp
    redis.call('HSET', key, 'f', fp)
  end
  local old = (r[3] or '0') .. ':' .. (r[2] or '') .. '\0' .. (r[4] or '0') .. ':' .. (r[7] or '0') .. '::\0' .. #f .. ':' .. f
  if state == '3' then
    local ca = tonumber(r[8]) or 0
    return {3, 'c' .. old .. string.format('%d:%d:', math.floor(ca / 1000), (ca % 1000) * 1000) .. (r[9] or '')}
  end
  if state == '1' and r[2] == owner then
    return take(r[3], r[4], f, 2)
  end
  if state == '1' and tonumber(r[5]) > now then
    return {2, 'p' .. old, tonumber(r[5]) - now}
  end
  return take((tonumber(r[3]) or 0) + 1, (tonumber(r[4]) or 0) + 1, f, state == '1' and 1 or 0)
end

if not v then
  return take(1, 1, fp, 0)
end

local state = string.sub(v, 1, 1)
local c1 = string.find(v, ':', 2, true)
local z = c1 and string.find(v, '\0', c1 + 1, true)
local c2 = z and string.find(v, ':', z + 1, true)
local c3 = c2 and string.find(v, ':', c2 + 1, true)
local c4 = c3 and string.find(v, ':', c3 + 1, true)
local z2 = c4 and string.find(v, '\0', c4 + 1, true)
local c5 = z2 and string.find(v, ':', z2 + 1, true)
if not c5 or (state ~= 'p' and state ~= 'r' and state ~= 'c') then
  return redis.error_reply('WRONGTYPE the key holds a string that is not a record of this store')
end
local token, rowner, attempt = string.sub(v, 2, c1 - 1), string.sub(v, c1 + 1, z - 1), string.sub(v, z + 1, c2 - 1)
local fplen = tonumber(string.sub(v, z2 + 1, c5 - 1))
local f = string.sub(v, c5 + 1, c5 + fplen)
if f == '' and fp ~= '' then
  -- The record adopts the first fingerprint it is given, whatever happens
  -- next.
  f = fp
  v = string.sub(v, 1, z2) .. #fp .. ':' .. fp .. string.sub(v, c5 + fplen + 1)
  redis.call('SET', key, v, 'KEEPTTL')
end

if state == 'c' then
  return {3, v}
end
if state == 'p' and rowner == owner then
  -- The owner's own lease, extended: it keeps its acquisition time and
  -- origin.
  local acquired = acquiredAt(v, c3 + 1, c4 - 1, string.sub(v, c2 + 1, c3 - 1))
  v = 'p' .. token .. ':' .. owner .. '\0' .. attempt .. ':' .. retention .. ':' .. acquired .. string.sub(v, c4)
  redis.call('SET', key, v, 'PX', px)
  return {1, v, 2}
end
if state == 'p' then
  local left = redis.call('PTTL', key) - tonumber(string.sub(v, c2 + 1, c3 - 1))
  if left > 0 then
    return {2, v, left}
  end
end
return take(tonumber(token) + 1, tonumber(attempt) + 1, f, state == 'p' and 1 or 0)
