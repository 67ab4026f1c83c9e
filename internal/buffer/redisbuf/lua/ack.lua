-- ack: removes entries the database committed from the shard's in-flight
-- hashes, clears their refusal counts, and refreshes the lock, if this
-- flusher still holds it. With ARGV[3] = "1" it also UNLINKs the in-flight
-- hashes it is given (the scan is complete).
--
-- KEYS[1] shard lock, KEYS[2] refusals hash, KEYS[3..] in-flight hashes
-- ARGV[1] lock token, ARGV[2] lock TTL in ms, ARGV[3] "1" to unlink,
-- then for each in-flight hash in KEYS order: the number of its fields that
-- follow, and those fields
--
-- Returns -1 when the lock is lost, else the number of fields removed.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local refusals = redis.call('EXISTS', KEYS[2]) == 1
local removed, a = 0, 4
for k = 3, #KEYS do
  local count = tonumber(ARGV[a])
  local first, last = a + 1, a + count
  for i = first, last, 1000 do
    local j = math.min(i + 999, last)
    removed = removed + redis.call('HDEL', KEYS[k], unpack(ARGV, i, j))
    if refusals then redis.call('HDEL', KEYS[2], unpack(ARGV, i, j)) end
  end
  a = last + 1
  if ARGV[3] == '1' then redis.call('UNLINK', KEYS[k]) end
end
return removed
