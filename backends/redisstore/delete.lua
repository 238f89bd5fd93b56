-- Deletes the record of KEYS[1]. Returns 1, or 0 if there was none.
return redis.call('DEL', KEYS[1])
