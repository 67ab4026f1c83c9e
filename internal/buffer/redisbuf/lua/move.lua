-- move: the functions that move the entries a touch recorded in a throttle
-- window (HSETNX into the window's hash of the user's bucket) into the
-- bucket's pending hash, prepended to the scripts that need them (swap,
-- fail, active). A moved entry stays in its window as "" (the user is still
-- throttled there), and the shard's hash of windows counts it
-- (<tag>windows: window end in Unix ms -> entries moved), so that a
-- window whose hashes hold as many entries as that count has nothing to
-- move (more: new entries; fewer: a hash was lost, and what was written
-- since may be new). The newest value wins in pending; a stored value a flush would
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

-- collect adds the new entries (value not "") of the window hash key to
-- acc (acc.uids: ids in the order found; acc.val: id -> value, the newest
-- timestamp when an id is in several windows, a number over a value that
-- is not one), appends (id, "") to marks when marks is given, and returns
-- how many entries it found.
local function collect(key, acc, marks)
  local kv = redis.call('HGETALL', key)
  local n = 0
  for i = 1, #kv, 2 do
    local uid, v = kv[i], kv[i + 1]
    if v ~= '' then
      n = n + 1
      if marks then marks[#marks + 1], marks[#marks + 2] = uid, '' end
      local cur = acc.val[uid]
      if cur == nil then
        acc.uids[#acc.uids + 1] = uid
        acc.val[uid] = v
      else
        local ts, c = tonumber(v), tonumber(cur)
        if ts and (not c or c < ts) then acc.val[uid] = v end
      end
    end
  end
  return n
end

-- put writes the entries of acc into the pending hash: all of them when it
-- does not exist (as after a swap), else the newest of each (read with
-- HMGET, 1,000 ids per call), replacing a stored value a flush would refuse
-- (not a number, or beyond the ceiling); a value that is not a number only
-- fills an empty or unreadable entry, so that the flush refuses, counts and
-- drops it.
local function put(pending, acc, ceiling)
  local uids, kv = acc.uids, {}
  if #uids == 0 then return end
  if redis.call('EXISTS', pending) == 0 then
    for _, uid in ipairs(uids) do
      kv[#kv + 1], kv[#kv + 2] = uid, acc.val[uid]
    end
  else
    for i = 1, #uids, 1000 do
      local cur = redis.call('HMGET', pending, unpack(uids, i, math.min(i + 999, #uids)))
      for j = 1, #cur do
        local uid = uids[i + j - 1]
        local v = acc.val[uid]
        local ts, c = tonumber(v), tonumber(cur[j])
        if (ts and (not c or c < ts or c > ceiling)) or (not ts and not c) then
          kv[#kv + 1], kv[#kv + 2] = uid, v
        end
      end
    end
  end
  hset_all(pending, kv)
end

-- move_alone moves the new entries of the window hash key, a bucket's
-- only window with entries to move, into the bucket's pending hash, which
-- does not exist, and returns how many it moved: what collect and put do
-- for one window, without their tables of ids and values. w is the
-- window's entry in swap's list: {end, ended, has new entries, ...}. An ended
-- window's hash is deleted; an open one keeps its moved entries as "".
local function move_alone(key, pending, w)
  local ended, new = w[2], w[3]
  if not new then
    if ended then redis.call('UNLINK', key) end
    return 0
  end
  local kv = redis.call('HGETALL', key)
  local out, marks, n = {}, {}, 0
  for i = 1, #kv, 2 do
    local v = kv[i + 1]
    if v ~= '' then
      out[n + 1], out[n + 2] = kv[i], v
      marks[n + 1], marks[n + 2] = kv[i], ''
      n = n + 2
    end
  end
  if ended then
    redis.call('UNLINK', key)
  elseif n > 0 then
    hset_all(key, marks)
  end
  hset_all(pending, out)
  return n / 2
end

-- rename_new turns the hash of bucket b of a window in list (swap's list
-- of {end, ended, has new entries, entries moved, entries}) that nothing was moved
-- from yet into the bucket's pending hash, which does not exist: every
-- entry of such a window is new, so the hash becomes the pending hash
-- (RENAME), and an open window's is written again with every field as ""
-- (its users stay throttled there). Redis scans a listpack-encoded hash
-- for each field it writes, so this spares one of the two writes of an
-- open window's entries and both of an ended one's. A "" found there all
-- the same (a count lost with the hash of windows) reaches the flush,
-- which skips it. It returns the window's index in list, or 0 when no
-- such window has a hash in this bucket.
local function rename_new(tag, b, list, pending)
  for i, w in ipairs(list) do
    if w[3] and w[4] == 0 then
      local key = window_key(tag, b, w[1])
      local n = redis.call('HLEN', key)
      if n > 0 then
        redis.call('RENAME', key, pending)
        if not w[2] then
          local fields, marks = redis.call('HKEYS', pending), {}
          for j, f in ipairs(fields) do
            marks[2 * j - 1], marks[2 * j] = f, ''
          end
          hset_all(key, marks)
        end
        return i
      end
    end
  end
  return 0
end

-- move_bucket moves every window's new entries of bucket b (the bucket of
-- the pending hash given) and returns how many it moved; the moved entries
-- stay in their windows as "".
local function move_bucket(pending, ceiling)
  local tag = tag_of(pending)
  local b = string.match(pending, 'pending:(%d+)$')
  local windows = tag .. 'windows'
  local acc, total = {uids = {}, val = {}}, 0
  for _, e in ipairs(redis.call('HKEYS', windows)) do
    local key, marks = window_key(tag, b, e), {}
    local n = collect(key, acc, marks)
    if n > 0 then
      hset_all(key, marks)
      redis.call('HSET', windows, e, (tonumber(redis.call('HGET', windows, e)) or 0) + n)
      total = total + n
    end
  end
  put(pending, acc, ceiling)
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

