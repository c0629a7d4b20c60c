-- readfold: max-merge the public cursors of one or more conversations in
-- one call (see `redis.conversations_per_call`).
-- Per conversation, in the order they come:
--   5 KEYS: <prefix>:{C}:cursors    hash user -> cursor, every present member
--           <prefix>:{C}:latest     latest seq of the conversation
--           <prefix>:{C}:joined     hash user -> join_seq (only when > 1)
--           <prefix>:{C}:epoch      hash user -> membership epoch (only when > 0)
--           <prefix>:{C}:delivered  hash user -> delivered cursor (only where a
--                                   write had it above the cursor)
--   ARGV:   the member count m, the latest seq, then m quadruples
--           (user, cursor, join_seq, epoch), cursor -1 = the member left;
--           then the count d of members whose delivered cursor is ahead of
--           their cursor, and d pairs (position, delivered): the member's
--           position among the m (from 1, ascending) and its delivered cursor.
-- Returns the cursors and delivered cursors raised, in all.
--
-- Delivered cursors come apart from the quadruples because most members
-- have none ahead of their cursor: for them a conversation costs one "0".
-- Readers take the higher of a member's delivered field and their cursor,
-- so a delivered cursor at the cursor says nothing and the caller sends
-- none.
--
-- Membership is ordered by epoch: a write of a lower epoch than the stored
-- one is stale and ignored; a higher epoch replaces the member (a departure
-- removes their cursor, join_seq and delivered fields, a rejoin brings them
-- back). Within one epoch a field is only ever raised, never lowered,
-- whoever calls and in whatever order.
--
-- A conversation's members are merged one after the other, as written
-- above, but against a copy of their stored fields read with one HMGET per
-- hash, and the results go back with one HSET (and HDEL) per hash: a call
-- into Redis costs more than the merge itself, and a flush carries hundreds
-- of members per group. For the same reason one call takes many small
-- conversations. Stored values are kept as the strings they came as, so
-- that a seq above 2^53 is written back exactly.
--
-- Redis's Lua is interpreted and this script runs once per member of every
-- flush, so it works by position: the HMGET answers are merged in place,
-- a repeated user at its first position, with no table keyed by user but
-- the one that finds that position.
--
-- Most conversations are 1:1 chats whose members joined at seq 1 and never
-- left: for those, the commands are most of the cost. So one MGET and one
-- MSET serve every latest seq of a call, one EXISTS over all its epoch
-- hashes spares each conversation its own when none exists (the usual
-- case), and such a conversation (`merge_plain`) takes one HMGET and at
-- most one HSET: about 8 us of Redis's time for a 1:1 chat, where a GET,
-- a SET and an EXISTS of its own made it 13. One or two members (a 1:1
-- chat's flush) are merged with no table built but the HMGET's answer
-- (`merge_two`; one member takes an HGET, `merge_one`): the tables and
-- loops of the general case were a tenth of Redis's time for a flush of
-- 1:1 chats. Delivered cursors ahead add one HMGET (an HGET for one) and
-- at most one HSET of the delivered hash (`merge_delivered`): in the
-- general case a 1:1 chat took twice the time.
local tonumber, call, unpack, min, error, byte = tonumber, redis.call, unpack, math.min, error, string.byte
local argv, keys = ARGV, KEYS
local CHUNK = 1000 -- fields per command, well under unpack's limit

-- key's fields for users[1..n], by position: the stored string, or false.
local function read(key, users, n)
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

-- Writes the changed fields of key back: set ones with HSET, removed ones
-- with HDEL.
local function write(key, users, n, values, changed)
  if next(changed) == nil then
    return
  end
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

-- Whether the member at argv[i] (user, cursor, join_seq, epoch) joined at
-- seq 1, with epoch 0, and is not leaving.
local function plain_member(i)
  -- 45: '-', a member leaving.
  return argv[i + 2] == '1' and argv[i + 3] == '0' and byte(argv[i + 1]) ~= 45
end

-- merge_plain of a conversation of one member.
local function merge_one(k, a)
  local i = a + 2
  if not plain_member(i) then
    return nil
  end
  local key, user, cursor = keys[k + 1], argv[i], argv[i + 1]
  local current = call('HGET', key, user)
  -- Not `<=`: a stored value that is no number ("nan" edited in by hand)
  -- must stay, as the general merge leaves it.
  if current and not (tonumber(cursor) > tonumber(current)) then
    return 0
  end
  call('HSET', key, user, cursor)
  return 1
end

-- merge_plain of a conversation of two members.
local function merge_two(k, a)
  local i, j = a + 2, a + 6
  local u, v = argv[i], argv[j]
  if u == v or not plain_member(i) or not plain_member(j) then
    return nil
  end
  local key, cu, cv = keys[k + 1], argv[i + 1], argv[j + 1]
  local stored = call('HMGET', key, u, v)
  local su, sv = stored[1], stored[2]
  local raise_u = not su or tonumber(cu) > tonumber(su)
  local raise_v = not sv or tonumber(cv) > tonumber(sv)
  if raise_u and raise_v then
    call('HSET', key, u, cu, v, cv)
    return 2
  elseif raise_u then
    call('HSET', key, u, cu)
    return 1
  elseif raise_v then
    call('HSET', key, v, cv)
    return 1
  end
  return 0
end

-- Merges the cursors of a conversation whose members all joined at seq 1,
-- with epoch 0, none leaving and none listed twice, and that has no epoch
-- hash (the caller checks that): its cursors hash is all it touches. Returns the cursors raised, or nil when
-- the conversation is not such a one (nothing is written then).
local function merge_plain(k, a, n)
  if n == 1 then
    return merge_one(k, a)
  elseif n == 2 then
    return merge_two(k, a)
  end
  local users = {}
  for j = 1, n do
    local i = a + 4 * j - 2
    if not plain_member(i) then
      return nil
    end
    users[j] = argv[i]
  end
  local seen = {}
  for j = 1, n do
    local user = users[j]
    if seen[user] then
      return nil
    end
    seen[user] = true
  end
  local key = keys[k + 1]
  local stored = read(key, users, n)
  local sets, s = {}, 0
  for j = 1, n do
    local cursor, current = argv[a + 4 * j - 1], stored[j]
    if not current or tonumber(cursor) > tonumber(current) then
      sets[s + 1] = users[j]
      sets[s + 2] = cursor
      s = s + 2
    end
  end
  for from = 1, s, 2 * CHUNK do
    call('HSET', key, unpack(sets, from, min(from + 2 * CHUNK - 1, s)))
  end
  return s / 2
end

-- Raises the delivered fields of a conversation that `merge_plain` took:
-- its members are present, each listed once, so each pair (their count at
-- argv[at_ahead]) is merged as it comes. Returns the fields raised.
local function merge_delivered(k, a, at_ahead)
  local d, key = tonumber(argv[at_ahead]), keys[k + 5]
  if d == 1 then
    local user, value = argv[a + 4 * tonumber(argv[at_ahead + 1]) - 2], argv[at_ahead + 2]
    local field = call('HGET', key, user)
    if field and not (tonumber(value) > tonumber(field)) then
      return 0
    end
    call('HSET', key, user, value)
    return 1
  end
  local users, values = {}, {}
  for p = 1, d do
    local q = at_ahead + 2 * p - 1
    users[p] = argv[a + 4 * tonumber(argv[q]) - 2]
    values[p] = argv[q + 1]
  end
  local stored = read(key, users, d)
  local sets, s = {}, 0
  for p = 1, d do
    local field = stored[p]
    if not field or tonumber(values[p]) > tonumber(field) then
      sets[s + 1] = users[p]
      sets[s + 2] = values[p]
      s = s + 2
    end
  end
  for from = 1, s, 2 * CHUNK do
    call('HSET', key, unpack(sets, from, min(from + 2 * CHUNK - 1, s)))
  end
  return s / 2
end

-- Merges one conversation's members: its keys follow keys[k] and its n
-- members follow argv[a + 1]; any_epochs: whether the call found any
-- epoch hash. Returns the cursors and delivered cursors raised.
local function merge(k, a, n, any_epochs)
  if n == 0 then
    return 0
  end
  -- The count of delivered cursors ahead, then their pairs.
  local at_ahead = a + 2 + 4 * n
  if not any_epochs then
    local raised = merge_plain(k, a, n)
    if raised then
      if argv[at_ahead] ~= '0' then
        raised = raised + merge_delivered(k, a, at_ahead)
      end
      return raised
    end
  end

  -- Delivered cursors ahead, by member position.
  local ahead, d = {}, tonumber(argv[at_ahead])
  for q = at_ahead + 1, at_ahead + 2 * d, 2 do
    ahead[tonumber(argv[q])] = argv[q + 1]
  end

  -- The users in order, repeats included; a user's first position, where a
  -- repeated user's fields are merged; whether any join_seq is above 1 (only
  -- those need the stored one to compare with).
  local users, first, any_join, repeats = {}, {}, false, false
  for j = 1, n do
    local i = a + 4 * j - 2
    local user = argv[i]
    users[j] = user
    if first[user] then
      repeats = true
    else
      first[user] = j
    end
    if not any_join and argv[i + 2] ~= '1' and tonumber(argv[i + 2]) > 1 then
      any_join = true
    end
  end

  -- Most conversations never had a join_seq above 1 or a membership epoch:
  -- those hashes do not exist, and reading nothing back costs nothing.
  local cursors = read(keys[k + 1], users, n)
  local joins = any_join and read(keys[k + 3], users, n) or {}
  local epochs = any_epochs and call('EXISTS', keys[k + 4]) == 1 and read(keys[k + 4], users, n) or {}
  local delivered = d > 0 and read(keys[k + 5], users, n) or {}

  -- Which fields a merge changed, by first position.
  local cursors_changed, joins_changed, epochs_changed, delivered_changed = {}, {}, {}, {}
  local raised = 0

  for j = 1, n do
    local at = repeats and first[users[j]] or j
    local i = a + 4 * j - 2
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
        -- Removed even where it was not read: a departed member's field
        -- must not outlive them, and HDEL of nothing costs little.
        cursors[at] = false
        cursors_changed[at] = true
        joins[at] = false
        joins_changed[at] = true
        delivered[at] = false
        delivered_changed[at] = true
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
        local reached = ahead[j]
        if reached then
          local field = delivered[at]
          -- Not `<=`, as above: a stored value that is no number stays.
          if not field or tonumber(reached) > tonumber(field) then
            delivered[at] = reached
            delivered_changed[at] = true
            raised = raised + 1
          end
        end
      end
    end
  end

  write(keys[k + 4], users, n, epochs, epochs_changed)
  write(keys[k + 1], users, n, cursors, cursors_changed)
  write(keys[k + 3], users, n, joins, joins_changed)
  write(keys[k + 5], users, n, delivered, delivered_changed)
  return raised
end

-- Where the conversation whose arguments start at argv[a] ends: past its
-- quadruples, its count of delivered pairs and those pairs.
local function after(a)
  local at_ahead = a + 2 + 4 * tonumber(argv[a])
  return at_ahead + 1 + 2 * tonumber(argv[at_ahead])
end

-- Whether text is a whole number of digits alone.
local function whole(text)
  return text ~= nil and text:find('^%d+$') ~= nil
end

-- The arguments' layout must fit the keys exactly before anything is
-- written: a call that does not is a bug in its caller, and must change
-- nothing. (A value that is no number fails where it is merged, after the
-- conversations before it: harmless, as every merge is idempotent and a
-- failed flush is written again whole.)
local nkeys, nargs, a = #keys, #argv, 1
if nkeys % 5 ~= 0 then
  error('readfold merge: ' .. nkeys .. ' keys, not 5 per conversation')
end
local function mismatch()
  error('readfold merge: arguments do not match the keys')
end
for _ = 1, nkeys / 5 do
  local count = argv[a]
  if not whole(count) or a + 2 + 4 * tonumber(count) > nargs then
    mismatch()
  end
  local m, at_ahead = tonumber(count), a + 2 + 4 * tonumber(count)
  local d = argv[at_ahead]
  if not whole(d) or at_ahead + 2 * tonumber(d) > nargs then
    mismatch()
  end
  -- Positions name members of this conversation, each once, in order.
  local last = 0
  for q = at_ahead + 1, at_ahead + 2 * tonumber(d), 2 do
    local position = argv[q]
    if not whole(position) or tonumber(position) <= last or tonumber(position) > m then
      mismatch()
    end
    last = tonumber(position)
  end
  a = at_ahead + 1 + 2 * tonumber(d)
end
if a ~= nargs + 1 then
  mismatch()
end

-- Every conversation's latest seq: one MGET, and one MSET of those raised,
-- before any member is merged.
local count = nkeys / 5
if count == 0 then
  return 0
end
local latest_keys, epoch_keys = {}, {}
for c = 1, count do
  latest_keys[c] = keys[5 * c - 3]
  epoch_keys[c] = keys[5 * c - 1]
end
local stored_latest = call('MGET', unpack(latest_keys))
local raised_latest, r = {}, 0
a = 1
for c = 1, count do
  if tonumber(argv[a + 1]) > tonumber(stored_latest[c] or '0') then
    raised_latest[r + 1] = latest_keys[c]
    raised_latest[r + 2] = argv[a + 1]
    r = r + 2
  end
  a = after(a)
end
if r > 0 then
  call('MSET', unpack(raised_latest, 1, r))
end

local any_epochs = call('EXISTS', unpack(epoch_keys)) > 0
local raised = 0
a = 1
for c = 1, count do
  raised = raised + merge(5 * (c - 1), a, tonumber(argv[a]), any_epochs)
  a = after(a)
end
return raised
