-- readfold: max-merge one user's own thread state in one call.
-- KEYS[1] = <prefix>:user:{U}:threads  hash "<thread>:<conversation>" ->
--           "<epoch>:<private cursor>" for every thread the user follows
--           (private cursor -1: they departed the conversation in that epoch)
-- ARGV: groups of 3: field, epoch, private cursor (-1 departed).
-- Ordered as merge_threads.lua orders followers: a lower epoch changes
-- nothing, a higher one replaces, within one epoch the cursor only rises.
-- Returns the number of values written.
if #KEYS ~= 1 or #ARGV % 3 ~= 0 then
  error('readfold merge_thread_private: ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local written = 0
for i = 1, #ARGV, 3 do
  local field, epoch, private = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local stored = redis.call('HGET', KEYS[1], field)
  local write = true
  if stored then
    local sep = string.find(stored, ':', 1, true)
    local s_epoch, s_private = tonumber(string.sub(stored, 1, sep - 1)), tonumber(string.sub(stored, sep + 1))
    if epoch < s_epoch then
      write = false
    elseif epoch == s_epoch then
      if private < s_private then private = s_private end
      write = private ~= s_private
    end
  end
  if write then
    redis.call('HSET', KEYS[1], field, epoch .. ':' .. private)
    written = written + 1
  end
end
return written
