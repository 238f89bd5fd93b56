-- Deletes the record of KEYS[1] and wakes the key's watchers (see
-- complete.lua). Returns 1, or 0 if there was none.
local n = redis.call('DEL', KEYS[1])
if n == 1 then
  pcall(redis.call, 'SPUBLISH', KEYS[1], '')
end
return n
