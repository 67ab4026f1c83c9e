-- read: the pending and in-flight values of some users, in one call: HMGET
-- of each bucket's pending hash and of its in-flight hash, each kind only
-- when one of its hashes exists (one EXISTS of all of them first), and of
-- the bucket's hash of each throttle window of its shard (HKEYS of the
-- shard's hash of windows, move.lua), whose entries no flush may have moved
-- yet ("" marks one it moved). The keys are of one shard (one Redis Cluster
-- slot), or of several on a single server.
--
-- KEYS[2i-1], KEYS[2i] the pending and the in-flight hash of the i-th
-- bucket entry (a bucket may have several entries, of at most 1,000 ids)
-- ARGV[1] the ids, one after the other, entry by entry in KEYS order
-- ARGV[2] the layout: for each entry, the number n of its ids, then the
-- length in bytes of each of its n ids, every number in two bytes (big
-- endian)
--
-- Returns, for each value found, a code and the value: the code is 2p for
-- a pending or a window value and 2p+1 for an in-flight one, p the position (from 0)
-- of its user in ARGV[1]. Nothing found: an empty array.
local packed, layout, at, l, p, out = ARGV[1], ARGV[2], 1, 1, 0, {}
local sub, byte = string.sub, string.byte
-- any reports whether one of KEYS[from], KEYS[from + 2], ... exists: one
-- EXISTS per 1,000 keys (unpack is bounded by Lua's C stack).
local function any(from)
  local list = {}
  for k = from, #KEYS, 2 do
    list[#list + 1] = KEYS[k]
  end
  for i = 1, #list, 1000 do
    if redis.call('EXISTS', unpack(list, i, math.min(i + 999, #list))) > 0 then
      return true
    end
  end
  return false
end
local waiting, flushing = any(1), any(2)
local ends, windowed = {}, false
for k = 1, #KEYS, 2 do
  local tag = tag_of(KEYS[k])
  if not ends[tag] then
    ends[tag] = redis.call('HKEYS', tag .. 'windows')
    windowed = windowed or #ends[tag] > 0
  end
end
if not (waiting or flushing or windowed) then
  return out
end
for k = 1, #KEYS, 2 do
  local hi, lo = byte(layout, l, l + 1)
  local n, ids = hi * 256 + lo, {}
  l = l + 2
  for i = 1, n do
    hi, lo = byte(layout, l, l + 1)
    local e = at + hi * 256 + lo
    ids[i] = sub(packed, at, e - 1)
    at, l = e, l + 2
  end
  local pending = waiting and redis.call('HMGET', KEYS[k], unpack(ids))
  local moving = flushing and redis.call('HMGET', KEYS[k + 1], unpack(ids))
  local tag = tag_of(KEYS[k])
  local b = string.match(KEYS[k], 'pending:(%d+)$')
  for _, e in ipairs(ends[tag]) do
    local recorded = redis.call('HMGET', window_key(tag, b, e), unpack(ids))
    for j = 1, n do
      if recorded[j] and recorded[j] ~= '' then
        out[#out + 1] = 2 * (p + j - 1)
        out[#out + 1] = recorded[j]
      end
    end
  end
  for j = 1, n do
    local code = 2 * (p + j - 1)
    if pending and pending[j] then
      out[#out + 1] = code
      out[#out + 1] = pending[j]
    end
    if moving and moving[j] then
      out[#out + 1] = code + 1
      out[#out + 1] = moving[j]
    end
  end
  p = p + n
end
return out
