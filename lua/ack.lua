-- ack: removes entries the database committed from the in-flight hash and
-- refreshes the lock, if this flusher still holds it. With ARGV[3] = "1" it
-- also UNLINKs the in-flight hash (the scan is complete).
--
-- KEYS[1] shard lock, KEYS[2] in-flight hash
-- ARGV[1] lock token, ARGV[2] lock TTL in ms, ARGV[3] "1" to unlink,
-- ARGV[4..] fields
--
-- Returns -1 when the lock is lost, else the number of fields removed.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local n = 0
for i = 4, #ARGV, 1000 do
  n = n + redis.call('HDEL', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
if ARGV[3] == '1' then redis.call('UNLINK', KEYS[2]) end
return n
