-- manifest: creates the buffer's manifest if it is absent, in one step,
-- keeps its settings current, and returns it as it was found.
--
-- KEYS[1] manifest hash (<prefix>:manifest)
-- ARGV[1] n, the number of field/value pairs that describe the buffer's
--         layout: written only when the manifest is created
-- ARGV[2] c, how many of those (the first c) must agree with the stored
--         manifest for the settings to be written
-- ARGV    n layout pairs, then settings pairs (field, value, ...): the
--         app's rules, each written when it differs from what is stored,
--         so an instance that agrees with the manifest writes nothing and
--         one whose layout disagrees (and is refused) writes nothing either
--
-- Returns HGETALL of KEYS[1] as it was before the settings were written:
-- field, value, field, value, ...
local n, c = tonumber(ARGV[1]), tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 3, 2 + 2 * n))
end
local before = redis.call('HGETALL', KEYS[1])
for i = 3, 1 + 2 * c, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) ~= ARGV[i + 1] then
    return before
  end
end
for i = 3 + 2 * n, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) ~= ARGV[i + 1] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return before
