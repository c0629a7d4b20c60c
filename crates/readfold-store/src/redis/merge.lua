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
local raised = 0
local latest = tonumber(ARGV[1])
if latest > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], ARGV[1])
end
for i = 2, #ARGV, 4 do
  local user = ARGV[i]
  local cursor = tonumber(ARGV[i + 1])
  local join = tonumber(ARGV[i + 2])
  local epoch = tonumber(ARGV[i + 3])
  local stored = tonumber(redis.call('HGET', KEYS[4], user) or '0')
  if epoch >= stored then
    if epoch > stored then
      redis.call('HSET', KEYS[4], user, ARGV[i + 3])
    end
    if cursor < 0 then
      redis.call('HDEL', KEYS[1], user)
      redis.call('HDEL', KEYS[3], user)
    else
      -- A present member always has a field, even at cursor 0: the hash
      -- doubles as the member list readers count over.
      local current = redis.call('HGET', KEYS[1], user)
      if not current or cursor > tonumber(current) then
        redis.call('HSET', KEYS[1], user, ARGV[i + 1])
        raised = raised + 1
      end
      if join > 1 and join > tonumber(redis.call('HGET', KEYS[3], user) or '0') then
        redis.call('HSET', KEYS[3], user, ARGV[i + 2])
      end
    end
  end
end
return raised
