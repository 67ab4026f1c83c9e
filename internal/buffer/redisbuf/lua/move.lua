-- move: the functions that move the entries a touch recorded in a throttle
-- window (HSETNX into the window's hash of the user's bucket) into the
-- bucket's pending hash, prepended to the scripts that need them (swap,
-- fail, active). A moved entry stays in its window as "" (the user is still
-- throttled there), and the shard's hash of windows counts it
-- (<tag>windows: window end in Unix ms -> entries moved), so that a
-- window whose hashes hold no more entries than that count has nothing to
-- move. The newest value wins in pending; a stored value a flush would
-- refuse (not a number, or beyond the ceiling) is replaced; a window value
-- that is not a number only fills an empty or unreadable pending entry, so
-- that the flush refuses, counts and drops it.
local function tag_of(pending)
  return string.match(pending, '^(.*)pending:%d+$')
end

-- window_key is the key of bucket b's hash of the window ending at e.
local function window_key(tag, b, e)
  return tag .. 'window:' .. b .. ':' .. e
end

-- hset_all sets the fields and values of kv (field, value, ...) in key,
-- 1,000 pairs per HSET (unpack is bounded by Lua's C stack).
local function hset_all(key, kv)
  for i = 1, #kv, 2000 do
    redis.call('HSET', key, unpack(kv, i, math.min(i + 1999, #kv)))
  end
end

-- move_window moves the new entries of one bucket's window hash w into
-- the pending hash and returns how many it moved: in bulk when the pending
-- hash is empty (as after a swap), else entry by entry, newest wins.
local function move_window(w, pending, ceiling)
  local kv = redis.call('HGETALL', w)
  local new, marks = {}, {}
  for i = 1, #kv, 2 do
    if kv[i + 1] ~= '' then
      new[#new + 1], new[#new + 2] = kv[i], kv[i + 1]
      marks[#marks + 1], marks[#marks + 2] = kv[i], ''
    end
  end
  if #new == 0 then return 0 end
  if redis.call('EXISTS', pending) == 0 then
    hset_all(pending, new)
  else
    for i = 1, #new, 2 do
      local uid, v = new[i], new[i + 1]
      local ts = tonumber(v)
      local cur = tonumber(redis.call('HGET', pending, uid))
      if (ts and (not cur or cur < ts or cur > ceiling)) or (not ts and not cur) then
        redis.call('HSET', pending, uid, v)
      end
    end
  end
  hset_all(w, marks)
  return #new / 2
end

-- move_bucket moves every window's new entries of bucket b (the bucket of
-- the pending hash given) and returns how many it moved.
local function move_bucket(pending, ceiling)
  local tag = tag_of(pending)
  local b = string.match(pending, 'pending:(%d+)$')
  local windows = tag .. 'windows'
  local total = 0
  for _, e in ipairs(redis.call('HKEYS', windows)) do
    local n = move_window(window_key(tag, b, e), pending, ceiling)
    if n > 0 then
      redis.call('HINCRBY', windows, e, n)
      total = total + n
    end
  end
  return total
end

-- window_sizes returns, for the shard of the n pending hashes from
-- KEYS[first], the list of its windows as {end, moved, entries} (entries:
-- the sum of HLEN of the window's hashes).
local function window_sizes(windows, first, n)
  local tag = tag_of(KEYS[first])
  local list = redis.call('HGETALL', windows)
  local out = {}
  for i = 1, #list, 2 do
    local e, size = list[i], 0
    for b = 0, n - 1 do
      size = size + redis.call('HLEN', window_key(tag, b, e))
    end
    out[#out + 1] = {e, tonumber(list[i + 1]) or 0, size}
  end
  return out, tag
end

