-- manifest: creates the buffer's manifest if it is absent, in one step, and
-- returns it as it is now (created by this call or by an earlier instance).
--
-- KEYS[1] manifest hash (<prefix>:manifest)
-- ARGV    field, value, field, value, ... (this instance's layout)
--
-- Returns HGETALL of KEYS[1]: field, value, field, value, ...
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])
