-- readfold: max-merge one conversation's public cursors in one call.
-- KEYS[1] = <prefix>:{C}:cursors  hash user -> cursor, every present member
-- KEYS[2] = <prefix>:{C}:latest   latest seq of the conversation
-- KEYS[3] = <prefix>:{C}:joined   hash user -> join_seq (only when > 1)
-- KEYS[4] = <prefix>:{C}:epoch    hash user -> membership epoch (only when > 0)
-- ARGV[1] = latest seq; then quadruples (user, cursor, join_seq, epoch);
-- cursor -1 = the member left.
-- Membership is ordered by epoch: a write of a lower epoch than the stored
-- one is stale and ignored; a higher epoch replaces the member (a departure
-- removes them, a rejoin brings them back). Within one epoch a field is only
-- ever raised, never lowered, whoever calls and in whatever order.
--
-- The members are merged one after the other, as written above, but against
-- a copy of their stored fields read with one HMGET per hash, and the
-- results go back with one HSET (and HDEL) per hash: a call into Redis
-- costs more than the merge itself, and a flush carries hundreds of members
-- per group. Stored values are kept as the strings they came as, so that a
-- seq above 2^53 is written back exactly.
--
-- Redis's Lua is interpreted and this script runs once per member of every
-- flush, so it works by position: the HMGET answers are merged in place,
-- a repeated user at its first position, with no table keyed by user but
-- the one that finds that position.
local tonumber, call, unpack, min = tonumber, redis.call, unpack, math.min
local argv, keys = ARGV, KEYS
local CHUNK = 1000 -- fields per command, well under unpack's limit

local nargs = #argv
if tonumber(argv[1]) > tonumber(call('GET', keys[2]) or '0') then
  call('SET', keys[2], argv[1])
end
if nargs < 5 then
  return 0
end

-- The users in order, repeats included; a user's first position, where a
-- repeated user's fields are merged; whether any join_seq is above 1 (only
-- those need the stored one to compare with).
local users, first, n, any_join, repeats = {}, {}, 0, false, false
for i = 2, nargs, 4 do
  n = n + 1
  local user = argv[i]
  users[n] = user
  if first[user] then
    repeats = true
  else
    first[user] = n
  end
  if not any_join and argv[i + 2] ~= '1' and tonumber(argv[i + 2]) > 1 then
    any_join = true
  end
end

-- key's fields for the users, by position: the stored string, or false.
local function read(key)
  if n <= CHUNK then
    return call('HMGET', key, unpack(users, 1, n))
  end
  local stored = {}
  for from = 1, n, CHUNK do
    local to = min(from + CHUNK - 1, n)
    local values = call('HMGET', key, unpack(users, from, to))
    for k = from, to do
      stored[k] = values[k - from + 1]
    end
  end
  return stored
end

-- Most conversations never had a join_seq above 1 or a membership epoch:
-- those hashes do not exist, and reading nothing back costs nothing.
local cursors = read(keys[1])
local joins = any_join and read(keys[3]) or {}
local epochs = call('EXISTS', keys[4]) == 1 and read(keys[4]) or {}

-- Which fields a merge changed, by first position.
local cursors_changed, joins_changed, epochs_changed = {}, {}, {}
local raised = 0

for k = 1, n do
  local at = repeats and first[users[k]] or k
  local i = 4 * k - 2
  -- fresh: the write's epoch is not below the stored one. Mostly it is
  -- the stored one, the very same string, and needs no converting.
  local epoch, stored = argv[i + 3], epochs[at]
  local fresh = epoch == stored
  if not fresh then
    local value = tonumber(epoch)
    stored = stored and tonumber(stored) or 0
    fresh = value >= stored
    if value > stored then
      epochs[at] = epoch
      epochs_changed[at] = true
    end
  end
  if fresh then
    local cursor = tonumber(argv[i + 1])
    if cursor < 0 then
      cursors[at] = false
      cursors_changed[at] = true
      joins[at] = false
      joins_changed[at] = true
    else
      -- A present member always has a field, even at cursor 0: the hash
      -- doubles as the member list readers count over.
      local current = cursors[at]
      if not current or cursor > tonumber(current) then
        cursors[at] = argv[i + 1]
        cursors_changed[at] = true
        raised = raised + 1
      end
      local join = argv[i + 2]
      if join ~= '1' then
        local value = tonumber(join)
        local joined = joins[at]
        if value > 1 and (not joined or value > tonumber(joined)) then
          joins[at] = join
          joins_changed[at] = true
        end
      end
    end
  end
end

-- Writes the changed fields of key back: set ones with HSET, removed ones
-- with HDEL.
local function write(key, values, changed)
  local sets, dels, s, d = {}, {}, 0, 0
  for at = 1, n do
    if changed[at] then
      local value = values[at]
      if value then
        sets[s + 1] = users[at]
        sets[s + 2] = value
        s = s + 2
      else
        d = d + 1
        dels[d] = users[at]
      end
    end
  end
  for from = 1, s, 2 * CHUNK do
    call('HSET', key, unpack(sets, from, min(from + 2 * CHUNK - 1, s)))
  end
  for from = 1, d, CHUNK do
    call('HDEL', key, unpack(dels, from, min(from + CHUNK - 1, d)))
  end
end

write(keys[4], epochs, epochs_changed)
write(keys[1], cursors, cursors_changed)
write(keys[3], joins, joins_changed)
return raised
