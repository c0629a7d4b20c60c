-- readfold: max-merge one user's private state in one call.
-- KEYS[1] = <prefix>:user:{U}:private  hash conversation -> private cursor
-- KEYS[2] = <prefix>:user:{U}:marks    hash conversation -> "<at>:<seq>"
--           (seq -1 = the latest action cleared the mark)
-- ARGV: quadruples (conversation, private cursor, mark at, mark seq); the
-- mark fields are empty when the member never marked the conversation.
-- The private cursor is only ever raised. A mark replaces the stored one
-- only if (at, seq) is greater, as the fold orders marks.
local raised = 0
for i = 1, #ARGV, 4 do
  local conv = ARGV[i]
  local cursor = tonumber(ARGV[i + 1])
  local current = tonumber(redis.call('HGET', KEYS[1], conv) or '-1')
  if cursor > current then
    redis.call('HSET', KEYS[1], conv, ARGV[i + 1])
    raised = raised + 1
  end
  if ARGV[i + 2] ~= '' then
    local at = tonumber(ARGV[i + 2])
    local seq = tonumber(ARGV[i + 3])
    local stored = redis.call('HGET', KEYS[2], conv)
    local newer = true
    if stored then
      local sep = string.find(stored, ':', 2, true)
      local s_at = tonumber(string.sub(stored, 1, sep - 1))
      local s_seq = tonumber(string.sub(stored, sep + 1))
      newer = at > s_at or (at == s_at and seq > s_seq)
    end
    if newer then
      redis.call('HSET', KEYS[2], conv, ARGV[i + 2] .. ':' .. ARGV[i + 3])
    end
  end
end
return raised
