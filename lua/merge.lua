-- merge: raises pending timestamps without touching throttle markers
-- (replacing stored values a flush would refuse, as touch.lua does); it
-- replays the in-process backlog after an outage.
--
-- KEYS[1] pending hash
-- ARGV[1] the latest acceptable value (ceiling, see parseMicros)
-- ARGV[2..] user id, Unix microseconds, user id, Unix microseconds, ...
--
-- Returns the number of pairs.
local ceiling = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]))
  if not cur or cur < tonumber(ARGV[i + 1]) or cur > ceiling then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return (#ARGV - 1) / 2
