-- swap: turns the pending hash into the in-flight hash (RENAME keeps both in
-- the shard's slot), if this flusher still holds the shard's lock and no
-- in-flight hash is left from an earlier flush.
--
-- KEYS[1] shard lock, KEYS[2] pending hash, KEYS[3] in-flight hash
-- ARGV[1] lock token
--
-- Returns -1 when the lock is lost, -2 when an in-flight hash exists, else
-- the number of entries moved (0 when nothing was pending).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('EXISTS', KEYS[3]) == 1 then return -2 end
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('RENAME', KEYS[2], KEYS[3])
return redis.call('HLEN', KEYS[3])
