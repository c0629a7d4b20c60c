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

-- The users, in order, repeats included: a repeated user's fields are read
-- twice alike, merged in turn and written back once, as the last merge left
-- them. Only a join_seq above 1 needs the stored one to compare with.
local users, n, any_join = {}, 0, false
for i = 2, #ARGV, 4 do
  n = n + 1
  users[n] = ARGV[i]
  if not any_join and tonumber(ARGV[i + 2]) > 1 then
    any_join = true
  end
end

-- key's fields for users: user -> stored string, or false when absent.
local function read(key)
  local stored = {}
  for from = 1, n, CHUNK do
    local to = math.min(from + CHUNK - 1, n)
    local values = redis.call('HMGET', key, unpack(users, from, to))
    for k = from, to do
      stored[users[k]] = values[k - from + 1]
    end
  end
  return stored
end

-- Most conversations never had a join_seq above 1 or a membership epoch:
-- those hashes do not exist, and reading nothing back costs nothing.
local cursors = read(KEYS[1])
local joins = any_join and read(KEYS[3]) or {}
local epochs = redis.call('EXISTS', KEYS[4]) == 1 and read(KEYS[4]) or {}

-- The fields a merge changed, each once, in order of first change.
local cursors_changed, joins_changed, epochs_changed = {}, {}, {}
local function mark(changed, user)
  if not changed[user] then
    changed[user] = true
    changed[#changed + 1] = user
  end
end

for i = 2, #ARGV, 4 do
  local user = ARGV[i]
  local cursor = tonumber(ARGV[i + 1])
  local epoch = tonumber(ARGV[i + 3])
  local stored = tonumber(epochs[user] or '0')
  if epoch >= stored then
    if epoch > stored then
      epochs[user] = ARGV[i + 3]
      mark(epochs_changed, user)
    end
    if cursor < 0 then
      cursors[user] = false
      mark(cursors_changed, user)
      joins[user] = false
      mark(joins_changed, user)
    else
      -- A present member always has a field, even at cursor 0: the hash
      -- doubles as the member list readers count over.
      local current = cursors[user]
      if not current or cursor > tonumber(current) then
        cursors[user] = ARGV[i + 1]
        mark(cursors_changed, user)
        raised = raised + 1
      end
      local join = tonumber(ARGV[i + 2])
      if join > 1 and join > tonumber(joins[user] or '0') then
        joins[user] = ARGV[i + 2]
        mark(joins_changed, user)
      end
    end
  end
end

-- Writes the changed fields of key back: set ones with HSET, removed ones
-- with HDEL.
local function write(key, values, changed)
  local sets, dels = {}, {}
  for _, user in ipairs(changed) do
    if values[user] then
      sets[#sets + 1] = user
      sets[#sets + 1] = values[user]
    else
      dels[#dels + 1] = user
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
