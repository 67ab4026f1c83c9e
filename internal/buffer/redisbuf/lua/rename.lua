-- rename: the last step of Buffer.Rename, once the newest of a user's
-- entries was copied to the new id's pending hash (merge.lua): removes the
-- old id's pending and in-flight values of its bucket that are not newer
-- than the value copied (a touch of the old id since the copy stays, for
-- another round), or that a flush would refuse anyway (not a number, or
-- beyond ARGV[3]), and, once none is left, its refusal count. A flush
-- holding the shard's lock then no longer finds the entry in flight, and
-- fail.lua does not requeue it.
--
-- KEYS[1] the pending hash of the old id's bucket, KEYS[2] its in-flight
-- hash, KEYS[3] the shard's refusals hash
-- ARGV[1] old id, ARGV[2] the value copied (Unix microseconds), ARGV[3] the
-- latest acceptable value (buffer.Ceiling)
--
-- Returns 1 when no entry of the old id is left, 0 when a newer one is.
local uid, copied, ceiling = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local left = 0
for i = 1, 2 do
  local v = tonumber(redis.call('HGET', KEYS[i], uid))
  if v and v > copied and v <= ceiling then
    left = 1
  else
    redis.call('HDEL', KEYS[i], uid)
  end
end
if left == 0 then redis.call('HDEL', KEYS[3], uid) end
return 1 - left
