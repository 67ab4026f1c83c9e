-- fail: moves entries the database refused on their own from the in-flight
-- hashes back into the pending hashes of their buckets (newest wins; a
-- pending value a flush would refuse is replaced, as move.lua does), after
-- moving those buckets' new throttle window entries there (move.lua), so
-- that the in-flight hashes can be cleared and the rest of the shard keeps
-- flowing. It counts each entry's refusals in the refusals hash (HINCRBY);
-- an entry refused for the ARGV[3]th time is dropped instead: removed from
-- the in-flight hash and from the refusals hash, not requeued. An entry no
-- longer in flight (the hash lost meanwhile) is skipped.
--
-- KEYS[1] shard lock, KEYS[2] refusals hash, then for each bucket involved
-- its in-flight hash and its pending hash (KEYS[2i+1], KEYS[2i+2] for
-- bucket index i from 1)
-- ARGV[1] lock token, ARGV[2] ceiling (buffer.Ceiling), ARGV[3] refusals
-- before an entry is dropped (0: never), ARGV[4..] bucket index, field,
-- value, bucket index, field, value, ...
--
-- Returns {-1} when the lock is lost, else {entries moved back to pending,
-- dropped field, dropped field, ...}.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local ceiling = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local moved, out = 0, {0}
for k = 4, #KEYS, 2 do
  move_bucket(KEYS[k], ceiling)
end
for i = 4, #ARGV, 3 do
  local b, field, value = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
  local inflight, pending = KEYS[2 * b + 1], KEYS[2 * b + 2]
  if redis.call('HDEL', inflight, field) == 1 then
    local n = redis.call('HINCRBY', KEYS[2], field, 1)
    if limit > 0 and n >= limit then
      redis.call('HDEL', KEYS[2], field)
      out[#out + 1] = field
    else
      moved = moved + 1
      local cur = tonumber(redis.call('HGET', pending, field))
      if not cur or cur < tonumber(value) or cur > ceiling then
        redis.call('HSET', pending, field, value)
      end
    end
  end
end
out[1] = moved
return out
