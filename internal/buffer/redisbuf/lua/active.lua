-- active: whether a shard has work for a flush: a pending or an in-flight
-- hash, a throttle window with entries no flush moved yet, or a window
-- ended whose hashes the swap is to delete.
--
-- KEYS[1..n] pending hashes of buckets 0..n-1, KEYS[n+1..2n] in-flight
-- hashes of the same buckets, KEYS[2n+1] the shard's hash of windows
-- ARGV[1] the clock in Unix ms
--
-- Returns 1 when the shard has work, else 0.
local n = (#KEYS - 1) / 2
for i = 1, 2 * n, 1000 do
  if redis.call('EXISTS', unpack(KEYS, i, math.min(i + 999, 2 * n))) > 0 then return 1 end
end
local now = tonumber(ARGV[1])
local sizes = window_sizes(KEYS[#KEYS], 1, n)
for _, w in ipairs(sizes) do
  if w[3] > w[2] or (w[3] > 0 and (tonumber(w[1]) or 0) <= now) then return 1 end
end
return 0
