-- active: whether a shard has work for a flush: a pending or an in-flight
-- hash, a throttle window with entries no flush moved yet, or a window
-- ended whose hashes the swap is to delete. On the way it deletes the
-- registration of a window over for ARGV[2] ms whose hashes are gone.
--
-- KEYS[1..n] pending hashes of buckets 0..n-1, KEYS[n+1..2n] in-flight
-- hashes of the same buckets, KEYS[2n+1] the shard's hash of windows
-- ARGV[1] the clock in Unix ms, ARGV[2] how long a window's registration
-- is kept after its end, in ms
--
-- Returns 1 when the shard has work, else 0.
local n = (#KEYS - 1) / 2
for i = 1, 2 * n, 1000 do
  if redis.call('EXISTS', unpack(KEYS, i, math.min(i + 999, 2 * n))) > 0 then return 1 end
end
local now, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local sizes = window_sizes(KEYS[#KEYS], 1, n)
for _, w in ipairs(sizes) do
  local e = tonumber(w[1]) or 0
  if w[3] ~= w[2] or (w[3] > 0 and e <= now) then return 1 end
  if w[3] == 0 and e + keep <= now then redis.call('HDEL', KEYS[#KEYS], w[1]) end
end
return 0
