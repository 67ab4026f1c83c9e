-- touch: records one touch atomically. It sets the throttle marker if it is
-- absent and, only then, raises the user's pending timestamp (never lowers
-- it; a stored value that a flush would refuse, not a number or beyond
-- ARGV[4], is replaced rather than kept as "newer") and adds the user to the
-- presence HyperLogLogs given as KEYS[3..] (none when they are turned off).
--
-- KEYS[1] throttle marker key, KEYS[2] pending hash, KEYS[3..n] HyperLogLogs
-- (the minute's online bucket, the day's active users; same shard tag)
-- ARGV[1] user id, ARGV[2] Unix microseconds, ARGV[3] throttle window in ms,
-- ARGV[4] the latest acceptable value (ceiling, see parseMicros),
-- ARGV[5..n+2] each HyperLogLog's time to live in seconds (EXPIRE); 0 skips
-- it (its period ended longer ago than it is kept)
--
-- Returns {1, window ms} when the touch was recorded and {0, marker PTTL in
-- ms} when the user was throttled (Redis SET NX PX and PTTL semantics).
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[3]) then
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
  if not cur or cur < tonumber(ARGV[2]) or cur > tonumber(ARGV[4]) then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  end
  for i = 3, #KEYS do
    local ttl = tonumber(ARGV[i + 2])
    if ttl and ttl > 0 then
      redis.call('PFADD', KEYS[i], ARGV[1])
      redis.call('EXPIRE', KEYS[i], ttl)
    end
  end
  return {1, tonumber(ARGV[3])}
end
return {0, redis.call('PTTL', KEYS[1])}
