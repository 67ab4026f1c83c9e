-- ack: removes entries the database committed from the in-flight hash,
-- clears their refusal counts, and refreshes the lock, if this flusher
-- still holds it. With ARGV[3] = "1" it also UNLINKs the in-flight hash (the
-- scan is complete).
--
-- KEYS[1] shard lock, KEYS[2] in-flight hash, KEYS[3] refusals hash
-- ARGV[1] lock token, ARGV[2] lock TTL in ms, ARGV[3] "1" to unlink,
-- ARGV[4..] fields
--
-- Returns -1 when the lock is lost, else the number of fields removed.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local refusals = redis.call('EXISTS', KEYS[3]) == 1
local n = 0
for i = 4, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  n = n + redis.call('HDEL', KEYS[2], unpack(ARGV, i, last))
  if refusals then redis.call('HDEL', KEYS[3], unpack(ARGV, i, last)) end
end
if ARGV[3] == '1' then redis.call('UNLINK', KEYS[2]) end
return n
