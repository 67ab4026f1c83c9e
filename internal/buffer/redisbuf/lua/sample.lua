-- sample: the sizes of one shard's pending and in-flight sets (the sum of
-- their buckets' HLEN) and, for each set, about ARGV[1] of its values
-- chosen at random (HRANDFIELD WITHVALUES, Redis 6.2 or later), taken from
-- each bucket in proportion to its size (at least one from each non-empty
-- bucket): the whole set when it holds at most ARGV[1] entries.
--
-- KEYS[1..n] pending hashes of buckets 0..n-1, KEYS[n+1..2n] in-flight
-- hashes of the same buckets
-- ARGV[1] values wanted per set (0: sizes only)
--
-- Returns {pending size, in-flight size, value, value, ...}.
local n = #KEYS / 2
local want = tonumber(ARGV[1])
local out = {0, 0}
for set = 0, 1 do
  local sizes, total = {}, 0
  for i = 1, n do
    sizes[i] = redis.call('HLEN', KEYS[set * n + i])
    total = total + sizes[i]
  end
  out[set + 1] = total
  if want > 0 and total > 0 then
    for i = 1, n do
      if sizes[i] > 0 then
        local take = math.ceil(want * sizes[i] / total)
        local r = redis.call('HRANDFIELD', KEYS[set * n + i], take, 'WITHVALUES')
        for j = 2, #r, 2 do out[#out + 1] = r[j] end
      end
    end
  end
end
return out
