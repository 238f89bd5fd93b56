-- Renews, completes or releases the lease on KEYS[1] if that lease still
-- holds it: the holder sends what it knows, and the script compares the
-- record's start with it and sets the record. See acquire.lua for the
-- record.
-- ARGV[1]: the start of the holder's record, 'p' token ':' owner '\0'.
-- ARGV[2] and after, one of:
--   'n', lease TTL (ms)   renew: the key then expires one retention after
--                         the new lease
--   'c', completion, output
--                         complete: the record, state 'c', is kept for its
--                         retention with the completion time (seconds ':'
--                         microseconds ':', by the holder's clock) and the
--                         output
--   'r'                   release: the record, state 'r', is kept for its
--                         retention
-- A completion or a release wakes the key's watchers: a message on the
-- sharded channel named as the key (ignored by a server without sharded
-- pub/sub). Returns 1, or 0 if the lease is lost.
local h, op = ARGV[1], ARGV[2]
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' or string.sub(v, 1, #h) ~= h then
  if type(v) == 'table' and redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
    return v -- WRONGTYPE: someone else's data under the prefix
  end
  return 0 -- lost, or a record of 0.1.0 (a hash), which no lease of this version holds
end
-- v is h, attempt ':' retention ':' acquired ':' and the rest.
local i = string.find(v, ':', #h + 1, true)
local j = string.find(v, ':', i + 1, true)
local retention = string.sub(v, i + 1, j - 1)
-- While the acquisition time is '~' and the lease TTL, it was the key's
-- expiry less the retention less that TTL (acquire.lua); it becomes that
-- time before the expiry moves. (acquiredAt in prelude.lua does the same;
-- this script, run for every message, does without the prelude.) The
-- record is then written as head, acquired and tail, in one
-- concatenation: each piece Lua joins makes a string of its own.
local head, acquired, tail
if string.byte(v, j + 1) == 126 then
  local k = string.find(v, ':', j + 1, true)
  local at = redis.pcall('PEXPIRETIME', KEYS[1]) -- Redis 7.0 and later
  if type(at) ~= 'number' then
    local ttl = redis.call('PTTL', KEYS[1])
    local t = redis.call('TIME')
    at = ttl < 0 and ttl or t[1] * 1000 + math.floor(t[2] / 1000) + ttl
  end
  acquired = '' -- unknown, for a key someone made persist
  if at >= 0 then
    acquired = string.format('%d', at - retention - string.sub(v, j + 2, k - 1))
  end
  head, tail = string.sub(v, 2, j), string.sub(v, k)
end
if op == 'n' then
  if acquired then
    redis.call('SET', KEYS[1], 'p' .. head .. acquired .. tail, 'PX', ARGV[3] + retention)
  else
    redis.call('PEXPIRE', KEYS[1], ARGV[3] + retention)
  end
  return 1
end
if retention == '0' then
  redis.call('DEL', KEYS[1])
elseif acquired then
  if op == 'c' then
    redis.call('SET', KEYS[1], 'c' .. head .. acquired .. tail .. ARGV[3] .. ARGV[4], 'PX', retention)
  else
    redis.call('SET', KEYS[1], 'r' .. head .. acquired .. tail, 'PX', retention)
  end
elseif op == 'c' then
  redis.call('SET', KEYS[1], 'c' .. string.sub(v, 2) .. ARGV[3] .. ARGV[4], 'PX', retention)
else
  redis.call('SET', KEYS[1], 'r' .. string.sub(v, 2), 'PX', retention)
end
pcall(redis.call, 'SPUBLISH', KEYS[1], '')
return 1
