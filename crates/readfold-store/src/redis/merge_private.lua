-- readfold: max-merge one user's private state in one call.
-- KEYS[1] = <prefix>:user:{U}:private   hash conversation -> private cursor
-- KEYS[2] = <prefix>:user:{U}:marks     hash conversation -> "<at>:<seq>"
--           (seq -1 = the latest action cleared the mark)
-- KEYS[3] = <prefix>:user:{U}:mentions  hash conversation -> "<read>:<s1>,<s2>,..."
-- KEYS[4] = <prefix>:user:{U}:mute      hash conversation -> "<at>:<until>"
-- ARGV: groups of 8 per conversation: conversation, private cursor, mark at,
-- mark seq, read point, mentions ("<s1>,<s2>,..." or empty), mute at, mute
-- until; the mark (mute) fields are empty when the member never marked
-- (muted) the conversation.
-- The private cursor is only ever raised. A mark or a mute replaces the
-- stored one only if (at, seq) or (at, until) is greater, as the fold orders
-- them. Mentions join: the greater read point, the union of the seqs above
-- it, the newest 100 (readfold_core's MAX_UNREAD_MENTIONS), so that no write
-- order brings back a read mention or loses an unread one.
local MAX_MENTIONS = 100

-- The layout must fit exactly before anything is written: a call that does
-- not is a bug in its caller, and must change nothing.
if #KEYS ~= 4 then
  error('readfold merge_private: ' .. #KEYS .. ' keys, not 4')
end
if #ARGV % 8 ~= 0 then
  error('readfold merge_private: ' .. #ARGV .. ' arguments, not 8 per conversation')
end

-- "<a>:<b>" as two numbers; a may be negative.
local function pair(text)
  local sep = string.find(text, ':', 2, true)
  return tonumber(string.sub(text, 1, sep - 1)), tonumber(string.sub(text, sep + 1))
end

-- Replaces the stored "<at>:<x>" of conv in key if (at, x) is greater.
local function newest(key, conv, at_text, x_text)
  local at, x = tonumber(at_text), tonumber(x_text)
  local stored = redis.call('HGET', key, conv)
  if stored then
    local s_at, s_x = pair(stored)
    if not (at > s_at or (at == s_at and x > s_x)) then
      return
    end
  end
  redis.call('HSET', key, conv, at_text .. ':' .. x_text)
end

-- Adds the seqs of a comma list to set, keeping those above read.
local function add_seqs(set, list, read)
  for s in string.gmatch(list, '[^,]+') do
    local seq = tonumber(s)
    if seq > read then
      set[seq] = true
    end
  end
end

local function merge_mentions(key, conv, read_text, list)
  local read = tonumber(read_text)
  local stored = redis.call('HGET', key, conv)
  local set = {}
  if stored then
    local sep = string.find(stored, ':', 1, true)
    read = math.max(read, tonumber(string.sub(stored, 1, sep - 1)))
    add_seqs(set, string.sub(stored, sep + 1), read)
  end
  add_seqs(set, list, read)
  local seqs = {}
  for seq in pairs(set) do
    seqs[#seqs + 1] = seq
  end
  -- Nothing read and nothing mentioned: no field to keep.
  if not stored and #seqs == 0 and read == 0 then
    return
  end
  table.sort(seqs)
  local first = math.max(1, #seqs - MAX_MENTIONS + 1)
  local kept = {}
  for i = first, #seqs do
    kept[#kept + 1] = string.format('%d', seqs[i])
  end
  local merged = string.format('%d', read) .. ':' .. table.concat(kept, ',')
  if merged ~= stored then
    redis.call('HSET', key, conv, merged)
  end
end

local raised = 0
for i = 1, #ARGV, 8 do
  local conv = ARGV[i]
  local cursor = tonumber(ARGV[i + 1])
  local current = tonumber(redis.call('HGET', KEYS[1], conv) or '-1')
  if cursor > current then
    redis.call('HSET', KEYS[1], conv, ARGV[i + 1])
    raised = raised + 1
  end
  if ARGV[i + 2] ~= '' then
    newest(KEYS[2], conv, ARGV[i + 2], ARGV[i + 3])
  end
  merge_mentions(KEYS[3], conv, ARGV[i + 4], ARGV[i + 5])
  if ARGV[i + 6] ~= '' then
    newest(KEYS[4], conv, ARGV[i + 6], ARGV[i + 7])
  end
end
return raised
