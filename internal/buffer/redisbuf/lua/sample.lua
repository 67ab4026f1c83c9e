-- sample: the sizes of one shard's pending and in-flight sets (the sum of
-- their buckets' HLEN; the pending size also counts the entries of the
-- shard's throttle windows that no flush moved yet, move.lua) and, for each
-- set, about ARGV[1] of its values chosen at random (HRANDFIELD WITHVALUES,
-- Redis 6.2 or later), taken from each bucket in proportion to its size (at
-- least one from each non-empty bucket): the whole set when it holds at
-- most ARGV[1] entries. The windows' entries are sampled the same way from
-- each window's hashes (moved entries, "", left out), so fewer than wanted
-- may come.
--
-- KEYS[1..n] pending hashes of buckets 0..n-1, KEYS[n+1..2n] in-flight
-- hashes of the same buckets, KEYS[2n+1] the shard's hash of windows
-- ARGV[1] values wanted per set (0: sizes only)
--
-- Returns {pending size, in-flight size, 1 when the values sampled left
-- out some window entries not moved yet else 0, value, value, ...}.
local n = (#KEYS - 1) / 2
local want = tonumber(ARGV[1])
local out = {0, 0, 0}
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
local windows, tag = window_sizes(KEYS[#KEYS], 1, n)
for _, w in ipairs(windows) do
  local unmoved = w[3] - w[2]
  if unmoved > 0 then
    out[1] = out[1] + unmoved
    if want > 0 then
      local got = 0
      for b = 0, n - 1 do
        local key = window_key(tag, b, w[1])
        local size = redis.call('HLEN', key)
        if size > 0 then
          local r = redis.call('HRANDFIELD', key, math.ceil(want * size / w[3]), 'WITHVALUES')
          for j = 2, #r, 2 do
            if r[j] ~= '' then
              out[#out + 1] = r[j]
              got = got + 1
            end
          end
        end
      end
      if got < unmoved then out[3] = 1 end
    end
  end
end
return out
