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
  for i = a + 1, a + n, 1000 do -- unpack is bounded by Lua's C stack: 1,000 ids a call
    local last = math.min(i + 999, a + n)
    local pending = redis.call('HMGET', KEYS[k], unpack(ARGV, i, last))
    local inflight = redis.call('HMGET', KEYS[k + 1], unpack(ARGV, i, last))
    for j = 1, last - i + 1 do
      out[#out + 1] = pending[j]
      out[#out + 1] = inflight[j]
    end
  end
  a = a + n + 1
end
return out
