-- read: the pending and in-flight values of some users of one shard, in one
-- call (HMGET of each bucket's pending and in-flight hash).
--
-- KEYS[2i-1], KEYS[2i] the pending and the in-flight hash of the i-th
-- bucket read
-- ARGV for each bucket in KEYS order: the number n of its users, then
-- their n ids
--
-- Returns, for each id in ARGV order, its pending value and its in-flight
-- value (nil when absent).
local out, a = {}, 1
for k = 1, #KEYS, 2 do
  local n = tonumber(ARGV[a])
  local ids = {unpack(ARGV, a + 1, a + n)}
  local pending = redis.call('HMGET', KEYS[k], unpack(ids))
  local inflight = redis.call('HMGET', KEYS[k + 1], unpack(ids))
  for i = 1, n do
    out[#out + 1] = pending[i]
    out[#out + 1] = inflight[i]
  end
  a = a + n + 1
end
return out
