-- fail: moves entries the database refused on their own from the in-flight
-- hash back into the pending hash (newest wins; a pending value a flush
-- would refuse is replaced, as touch.lua does), so that the in-flight hash
-- can be cleared and the rest of the shard keeps flowing.
--
-- KEYS[1] shard lock, KEYS[2] in-flight hash, KEYS[3] pending hash
-- ARGV[1] lock token, ARGV[2] ceiling (see parseMicros),
-- ARGV[3..] field, value, field, value, ...
--
-- Returns -1 when the lock is lost, else the number of entries moved.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local ceiling = tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  redis.call('HDEL', KEYS[2], ARGV[i])
  local cur = tonumber(redis.call('HGET', KEYS[3], ARGV[i]))
  if not cur or cur < tonumber(ARGV[i + 1]) or cur > ceiling then
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  end
end
return (#ARGV - 2) / 2
