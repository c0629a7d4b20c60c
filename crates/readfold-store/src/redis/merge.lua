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
local CHUNK = 1000 -- fields per command, well under unpack's limit

local raised = 0
local latest = tonumber(ARGV[1])
if latest > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], ARGV[1])
end
if #ARGV < 5 then
  return 0
end

-- The distinct users, in order of first appearance.
local users, seen = {}, {}
for i = 2, #ARGV, 4 do
  local user = ARGV[i]
  if not seen[user] then
    seen[user] = true
    users[#users + 1] = user
  end
end

-- key's fields for users: user -> stored string, or false when absent.
local function read(key)
  local stored = {}
  for from = 1, #users, CHUNK do
    local to = math.min(from + CHUNK - 1, #users)
    local values = redis.call('HMGET', key, unpack(users, from, to))
    for k = from, to do
      stored[users[k]] = values[k - from + 1]
    end
  end
  return stored
end

local cursors, joins, epochs = read(KEYS[1]), read(KEYS[3]), read(KEYS[4])
-- The fields a merge changed: user -> true.
local cursors_changed, joins_changed, epochs_changed = {}, {}, {}

for i = 2, #ARGV, 4 do
  local user = ARGV[i]
  local cursor = tonumber(ARGV[i + 1])
  local join = tonumber(ARGV[i + 2])
  local epoch = tonumber(ARGV[i + 3])
  local stored = tonumber(epochs[user] or '0')
  if epoch >= stored then
    if epoch > stored then
      epochs[user] = ARGV[i + 3]
      epochs_changed[user] = true
    end
    if cursor < 0 then
      cursors[user] = false
      cursors_changed[user] = true
      joins[user] = false
      joins_changed[user] = true
    else
      -- A present member always has a field, even at cursor 0: the hash
      -- doubles as the member list readers count over.
      local current = cursors[user]
      if not current or cursor > tonumber(current) then
        cursors[user] = ARGV[i + 1]
        cursors_changed[user] = true
        raised = raised + 1
      end
      if join > 1 and join > tonumber(joins[user] or '0') then
        joins[user] = ARGV[i + 2]
        joins_changed[user] = true
      end
    end
  end
end

-- Writes the changed fields of key back: set ones with HSET, removed ones
-- with HDEL.
local function write(key, values, changed)
  local sets, dels = {}, {}
  for _, user in ipairs(users) do
    if changed[user] then
      if values[user] then
        sets[#sets + 1] = user
        sets[#sets + 1] = values[user]
      else
        dels[#dels + 1] = user
      end
    end
  end
  for from = 1, #sets, 2 * CHUNK do
    redis.call('HSET', key, unpack(sets, from, math.min(from + 2 * CHUNK - 1, #sets)))
  end
  for from = 1, #dels, CHUNK do
    redis.call('HDEL', key, unpack(dels, from, math.min(from + CHUNK - 1, #dels)))
  end
end

write(KEYS[4], epochs, epochs_changed)
write(KEYS[1], cursors, cursors_changed)
write(KEYS[3], joins, joins_changed)
return raised
