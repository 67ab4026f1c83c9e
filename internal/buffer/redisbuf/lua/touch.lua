-- touch: records one touch atomically. When the user has no open throttle
-- window, it opens one (the user's marker field in the marker hash of the
-- current generation) and, only then, raises the user's pending timestamp
-- (never lowers it; a stored value that a flush would refuse, not a number
-- or beyond ARGV[4], is replaced rather than kept as "newer"). The presence
-- HyperLogLogs are the flush's: it adds the entries it drains (Scan).
--
-- Markers (see the Go package's doc): the clock is cut into generations of
-- one throttle window; a marker is the end of the user's window in ms from
-- the start of the generation whose hash holds it, and a generation's hash
-- expires at the end of the next generation (every window ends by then).
-- The previous and the next generation are read too, so windows opened by
-- an instance whose clock is a little behind or ahead still throttle.
--
-- KEYS[1] marker hash of the current generation, KEYS[2] of the previous,
-- KEYS[3] of the next, KEYS[4] pending hash
-- ARGV[1] user id, ARGV[2] Unix microseconds, ARGV[3] throttle window in ms,
-- ARGV[4] the latest acceptable value (buffer.Ceiling),
-- ARGV[5] ms since the current generation started, ARGV[6] generation
-- length in ms
--
-- Returns {1, window ms} when the touch was recorded and {0, ms left in the
-- open window} when the user was throttled.
local uid, now, gen = ARGV[1], tonumber(ARGV[5]), tonumber(ARGV[6])
local starts = {0, -gen, gen}
local stale = {}
for i = 1, 3 do
  local v = tonumber(redis.call('HGET', KEYS[i], uid))
  if v and not (v > 0 and v <= 2 * gen) then v = nil end -- not a value this script writes
  if v then
    local left = v + starts[i] - now
    if left > 0 then return {0, left} end
    stale[#stale + 1] = i
  end
end
for _, i in ipairs(stale) do
  if i > 1 then redis.call('HDEL', KEYS[i], uid) end
end
redis.call('HSET', KEYS[1], uid, now + tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[1], 2 * gen - now)
local cur = tonumber(redis.call('HGET', KEYS[4], uid))
if not cur or cur < tonumber(ARGV[2]) or cur > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[4], uid, ARGV[2])
end
return {1, tonumber(ARGV[3])}
