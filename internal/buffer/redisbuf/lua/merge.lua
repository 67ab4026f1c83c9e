-- merge: raises pending timestamps (replacing stored values a flush would
-- refuse, as move.lua does) after moving the new entries of the buckets'
-- throttle windows there (move.lua), so that a user has one entry waiting:
-- a late touch, whose window is over, the copy of a renamed user's
-- timestamp, and the replay of the in-process backlog after an outage.
--
-- KEYS[1..n] pending hashes (buckets of one shard)
-- ARGV[1] the latest acceptable value (buffer.Ceiling)
-- ARGV[2..] key index (1..n), user id, Unix microseconds, key index, ...
--
-- Returns the number of entries.
local ceiling = tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  move_bucket(key, ceiling)
end
for i = 2, #ARGV, 3 do
  local key, uid, ts = KEYS[tonumber(ARGV[i])], ARGV[i + 1], tonumber(ARGV[i + 2])
  local cur = tonumber(redis.call('HGET', key, uid))
  if not cur or cur < ts or cur > ceiling then
    redis.call('HSET', key, uid, ARGV[i + 2])
  end
end
return (#ARGV - 1) / 3
