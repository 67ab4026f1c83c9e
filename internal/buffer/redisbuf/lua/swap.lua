-- swap: turns the shard's pending hashes into its in-flight hashes (RENAME,
-- bucket by bucket; every key is in the shard's slot), if this flusher
-- still holds the shard's lock and no in-flight hash is left from an
-- earlier flush.
--
-- KEYS[1] shard lock, KEYS[2..n+1] pending hashes of buckets 0..n-1,
-- KEYS[n+2..2n+1] in-flight hashes of the same buckets
-- ARGV[1] lock token
--
-- Returns {-1} when the lock is lost, {-2} when an in-flight hash exists,
-- else {entries moved, bucket, bucket, ...}: the buckets (from 0) whose
-- pending hash was moved ({0} when nothing was pending).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local n = (#KEYS - 1) / 2
for i = n + 2, #KEYS, 1000 do
  if redis.call('EXISTS', unpack(KEYS, i, math.min(i + 999, #KEYS))) > 0 then return {-2} end
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
