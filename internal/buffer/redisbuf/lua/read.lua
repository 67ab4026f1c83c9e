-- read: the pending and in-flight values of some users, in one call: HMGET
-- of each bucket's pending hash, and of its in-flight hash when a flush has
-- one (one EXISTS of all of them first). The keys are of one shard (one
-- Redis Cluster slot), or of several on a single server.
--
-- KEYS[2i-1], KEYS[2i] the pending and the in-flight hash of the i-th
-- bucket read
-- ARGV for each bucket in KEYS order: the number n of its users, then the
-- length in bytes of each of their n ids; last, ARGV[#ARGV]: the ids, one
-- after the other, bucket by bucket in KEYS order
--
-- Returns, for each value found, a code and the value: the code is 2p for
-- a pending value and 2p+1 for an in-flight one, p the position (from 0)
-- of its user in ARGV[#ARGV]. Nothing found: an empty array.
local packed, at, a, p, out = ARGV[#ARGV], 1, 1, 0, {}
local inflight = {}
for k = 2, #KEYS, 2 do
  inflight[#inflight + 1] = KEYS[k]
end
local flushing = false
for i = 1, #inflight, 1000 do -- unpack is bounded by Lua's C stack: 1,000 keys a call
  if redis.call('EXISTS', unpack(inflight, i, math.min(i + 999, #inflight))) > 0 then
    flushing = true
    break
  end
end
for k = 1, #KEYS, 2 do
  local n, ids = tonumber(ARGV[a]), {}
  for i = 1, n do
    local len = tonumber(ARGV[a + i])
    ids[i] = string.sub(packed, at, at + len - 1)
    at = at + len
  end
  a = a + n + 1
  for i = 1, n, 1000 do
    local last = math.min(i + 999, n)
    local pending = redis.call('HMGET', KEYS[k], unpack(ids, i, last))
    local moving = flushing and redis.call('HMGET', KEYS[k + 1], unpack(ids, i, last))
    for j = 1, last - i + 1 do
      local code = 2 * (p + i + j - 2)
      if pending[j] then
        out[#out + 1] = code
        out[#out + 1] = pending[j]
      end
      if moving and moving[j] then
        out[#out + 1] = code + 1
        out[#out + 1] = moving[j]
      end
    end
  end
  p = p + n
end
return out
