-- manifest: creates the buffer's manifest if it is absent, in one step,
-- keeps its settings current, and returns it as it is now.
--
-- KEYS[1] manifest hash (<prefix>:manifest)
-- ARGV[1] n, the number of field/value pairs that follow and describe the
--         buffer's layout: written only when the manifest is created
-- ARGV    n layout pairs, then settings pairs (field, value, ...): the
--         app's rules, written when they differ from what is stored, so an
--         instance that agrees with the manifest writes nothing
--
-- Returns HGETALL of KEYS[1] as it was before the settings were updated:
-- field, value, field, value, ...
local n = tonumber(ARGV[1])
local created = redis.call('EXISTS', KEYS[1]) == 0
if created then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2, 1 + 2 * n))
end
local before = redis.call('HGETALL', KEYS[1])
for i = 2 + 2 * n, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) ~= ARGV[i + 1] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return before
