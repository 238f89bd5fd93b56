-- Takes the lease on KEYS[1] if its record is still the one the caller
-- read (Acquire's SET NX PX GET answered with it): a compare and set.
-- ARGV: the record read, the record to write, its expiry (PX, ms), and,
-- for a record in state 'p' of another owner, its retention (ms; '' for
-- none): that lease may still be live, and the key then expires more than
-- one retention from now.
-- Returns 1 when the lease is taken, 0 when the record changed since it
-- was read (the caller runs acquire.lua), or, for a lease still live, a
-- negative number: less the milliseconds left on it.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[4] ~= '' then
  local left = redis.call('PTTL', KEYS[1]) - ARGV[4]
  if left > 0 then
    return -left
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
