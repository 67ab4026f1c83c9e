-- swap: moves the new entries of the shard's throttle windows into its
-- pending hashes (move.lua), deletes the windows over for longer than
-- ARGV[3] (their users can no longer be throttled by them), then turns the
-- shard's pending hashes into its in-flight hashes (RENAME, bucket by
-- bucket; every key is in the shard's slot), if this flusher still holds
-- the shard's lock and no in-flight hash is left from an earlier flush.
--
-- KEYS[1] shard lock, KEYS[2..n+1] pending hashes of buckets 0..n-1,
-- KEYS[n+2..2n+1] in-flight hashes of the same buckets, KEYS[2n+2] the
-- shard's hash of windows
-- ARGV[1] lock token, ARGV[2] the flusher's clock in Unix ms, ARGV[3] how
-- long a window is kept after its end, in ms, ARGV[4] the latest
-- acceptable value (buffer.Ceiling)
--
-- Returns {-1} when the lock is lost, {-2} when an in-flight hash exists,
-- else {entries moved, bucket, bucket, ...}: the buckets (from 0) whose
-- pending hash was moved ({0} when nothing was pending).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local n = (#KEYS - 2) / 2
local windows = KEYS[#KEYS]
for i = n + 2, 2 * n + 1, 1000 do
  if redis.call('EXISTS', unpack(KEYS, i, math.min(i + 999, 2 * n + 1))) > 0 then return {-2} end
end
local now, keep, ceiling = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local sizes, tag = window_sizes(windows, 2, n)
for _, w in ipairs(sizes) do
  local e, moved, size = w[1], w[2], w[3]
  if size > moved then
    local count = 0
    for b = 0, n - 1 do
      count = count + move_window(window_key(tag, b, e), KEYS[b + 2], ceiling)
    end
    redis.call('HINCRBY', windows, e, count)
  end
  if (tonumber(e) or 0) + keep <= now then
    for b = 0, n - 1 do
      redis.call('UNLINK', window_key(tag, b, e))
    end
    redis.call('HDEL', windows, e)
  end
end
local out = {0}
for i = 2, n + 1 do
  local size = redis.call('HLEN', KEYS[i])
  if size > 0 then
    redis.call('RENAME', KEYS[i], KEYS[i + n])
    out[1] = out[1] + size
    out[#out + 1] = i - 2
  end
end
return out
