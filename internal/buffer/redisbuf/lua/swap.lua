-- swap: moves the new entries of the shard's throttle windows into its
-- pending hashes (move.lua; a window nothing was moved from yet, where the
-- bucket has no pending hash, by renaming its hash: rename_new): an
-- open window keeps its moved entries as ""
-- (the users stay throttled until it ends), an ended one's hashes are
-- deleted (its count of moved entries back to 0); a window's registration
-- is deleted once it has been over for ARGV[3], so that until then a touch
-- of an instance whose clock runs behind, which recreates its hash, is
-- found and moved too. Then it turns the
-- shard's pending hashes into its in-flight hashes (RENAME, bucket by
-- bucket; every key is in the shard's slot), if this flusher still holds
-- the shard's lock and no in-flight hash is left from an earlier flush.
--
-- KEYS[1] shard lock, KEYS[2..n+1] pending hashes of buckets 0..n-1,
-- KEYS[n+2..2n+1] in-flight hashes of the same buckets, KEYS[2n+2] the
-- shard's hash of windows
-- ARGV[1] lock token, ARGV[2] the flusher's clock in Unix ms, ARGV[3] how
-- long a window is kept after its end, in ms, ARGV[4] the latest
-- acceptable value (buffer.Ceiling)
--
-- Returns {-1} when the lock is lost, {-2} when an in-flight hash exists,
-- else {entries moved, bucket, bucket, ...}: the buckets (from 0) whose
-- pending hash was moved ({0} when nothing was pending).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local n = (#KEYS - 2) / 2
local windows = KEYS[#KEYS]
for i = n + 2, 2 * n + 1, 1000 do
  if redis.call('EXISTS', unpack(KEYS, i, math.min(i + 999, 2 * n + 1))) > 0 then return {-2} end
end
local now, keep, ceiling = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local sizes, tag = window_sizes(windows, 2, n)
-- A window's hashes hold as many entries as its count says were moved
-- unless some are new; fewer means a hash was lost (evicted, deleted) and
-- what was written since may be new too. After the move every field of
-- an open window is "", so its count becomes its number of fields: a
-- count lost, wrong or not a number is right again.
local list = {}
for _, w in ipairs(sizes) do
  local ended = (tonumber(w[1]) or 0) <= now
  local new = w[3] ~= w[2]
  if new or (ended and w[3] > 0) then
    list[#list + 1] = {w[1], ended, new, w[2], w[3]}
  end
end
if #list > 0 then
  for b = 0, n - 1 do
    local pending = KEYS[b + 2]
    local fresh, done = redis.call('EXISTS', pending) == 0, 0
    if fresh then
      done = rename_new(tag, b, list, pending)
      fresh = done == 0
    end
    if done == 0 and fresh and #list == 1 then
      move_alone(window_key(tag, b, list[1][1]), pending, list[1])
    elseif done == 0 or #list > 1 then
      local acc = {uids = {}, val = {}}
      for i, w in ipairs(list) do
        if i ~= done then
          local key = window_key(tag, b, w[1])
          if w[2] then
            if w[3] then collect(key, acc, nil) end
            redis.call('UNLINK', key)
          else
            local marks = {}
            if collect(key, acc, marks) > 0 then hset_all(key, marks) end
          end
        end
      end
      put(pending, acc, ceiling)
    end
  end
  for _, w in ipairs(list) do
    redis.call('HSET', windows, w[1], w[2] and 0 or w[5])
  end
end
for _, w in ipairs(sizes) do
  local e = w[1]
  if (tonumber(e) or 0) + keep <= now then
    redis.call('HDEL', windows, e)
  end
end
local out = {0}
for i = 2, n + 1 do
  local size = redis.call('HLEN', KEYS[i])
  if size > 0 then
    redis.call('RENAME', KEYS[i], KEYS[i + n])
    out[1] = out[1] + size
    out[#out + 1] = i - 2
  end
end
return out
