-- fail: moves entries the database refused on their own from the in-flight
-- hash back into the pending hash (newest wins; a pending value a flush
-- would refuse is replaced, as touch.lua does), so that the in-flight hash
-- can be cleared and the rest of the shard keeps flowing. It counts each
-- entry's refusals in the refusals hash (HINCRBY); an entry refused for the
-- ARGV[3]th time is dropped instead: removed from the in-flight hash and
-- from the refusals hash, not requeued.
--
-- KEYS[1] shard lock, KEYS[2] in-flight hash, KEYS[3] pending hash,
-- KEYS[4] refusals hash
-- ARGV[1] lock token, ARGV[2] ceiling (see parseMicros), ARGV[3] refusals
-- before an entry is dropped (0: never), ARGV[4..] field, value, field,
-- value, ...
--
-- Returns {-1} when the lock is lost, else {entries moved back to pending,
-- dropped field, dropped field, ...}.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local ceiling = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local moved, out = 0, {0}
for i = 4, #ARGV, 2 do
  redis.call('HDEL', KEYS[2], ARGV[i])
  local n = redis.call('HINCRBY', KEYS[4], ARGV[i], 1)
  if limit > 0 and n >= limit then
    redis.call('HDEL', KEYS[4], ARGV[i])
    out[#out + 1] = ARGV[i]
  else
    moved = moved + 1
    local cur = tonumber(redis.call('HGET', KEYS[3], ARGV[i]))
    if not cur or cur < tonumber(ARGV[i + 1]) or cur > ceiling then
      redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
    end
  end
end
out[1] = moved
return out
