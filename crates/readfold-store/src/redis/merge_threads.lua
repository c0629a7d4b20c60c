-- readfold: max-merge the followers of threads of one conversation.
-- KEYS[1]    = <prefix>:{C}:threads   hash thread -> latest thread seq
-- KEYS[1+i]  = <prefix>:{C}:t:<T_i>   hash user -> "<epoch>:<cursor>:<join_seq>"
--              (cursor -1: the follower departed in that epoch)
-- ARGV: per thread i, in KEYS order: thread, latest, follower count n, then
-- n groups of user, epoch, cursor (-1 departed), join_seq.
-- A follower's value is ordered by the member's epoch (membership events
-- applied, which only grows): a lower epoch is stale and changes nothing, a
-- higher one replaces the value, and within one epoch the cursor and the
-- join_seq are only ever raised. So a replay or a racing writer never
-- lowers a cursor, and a stale write never brings back a departed
-- follower. The latest thread seq is only ever raised.
-- Returns the number of values written.

-- Checks the whole layout before anything is written.
local threads = #KEYS - 1
local at = 1
for i = 1, threads do
  local n = tonumber(ARGV[at + 2])
  if n == nil then
    error('readfold merge_threads: thread ' .. i .. ' has no follower count')
  end
  at = at + 3 + 4 * n
end
if threads < 1 or at ~= #ARGV + 1 then
  error('readfold merge_threads: ' .. #ARGV .. ' arguments do not fit ' .. #KEYS .. ' keys')
end

local function parse(text)
  local a = string.find(text, ':', 1, true)
  local b = string.find(text, ':', a + 1, true)
  return tonumber(string.sub(text, 1, a - 1)), tonumber(string.sub(text, a + 1, b - 1)),
    tonumber(string.sub(text, b + 1))
end

local written = 0
at = 1
for i = 1, threads do
  local key, thread, latest, n = KEYS[1 + i], ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local stored_latest = tonumber(redis.call('HGET', KEYS[1], thread) or '0')
  if latest > stored_latest then
    redis.call('HSET', KEYS[1], thread, latest)
  end
  at = at + 3
  for _ = 1, n do
    local user, epoch, cursor, join = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    at = at + 4
    local stored = redis.call('HGET', key, user)
    local write = true
    if stored then
      local s_epoch, s_cursor, s_join = parse(stored)
      if epoch < s_epoch then
        write = false
      elseif epoch == s_epoch then
        if cursor < s_cursor then cursor = s_cursor end
        if join < s_join then join = s_join end
        write = cursor ~= s_cursor or join ~= s_join
      end
    end
    if write then
      redis.call('HSET', key, user, epoch .. ':' .. cursor .. ':' .. join)
      written = written + 1
    end
  end
end
return written
