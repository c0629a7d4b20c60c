-- Writes users' badges, each unless its hash holds a newer publication (a
-- zombie instance's or a retry's write loses to it).
-- KEYS: one badge hash per user (P:user:{U}:badge).
-- ARGV: per user, in KEYS' order: updated_at, badge, conversations,
-- messages, mentions.
-- Returns the number of hashes written.
local written = 0
for i, key in ipairs(KEYS) do
  local a = (i - 1) * 5
  local at = ARGV[a + 1]
  local stored = redis.call('HGET', key, 'updated_at')
  if not stored or tonumber(stored) <= tonumber(at) then
    redis.call('HSET', key, 'updated_at', at, 'badge', ARGV[a + 2],
      'conversations', ARGV[a + 3], 'messages', ARGV[a + 4], 'mentions', ARGV[a + 5])
    written = written + 1
  end
end
return written
