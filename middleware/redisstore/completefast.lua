-- completefast.lua: the fast section of Store.Complete, after ownedfast.lua
-- and before prelude.lua and complete.lua (same KEYS and ARGV). The common
-- case, an IN_PROGRESS string (P, or N as a fresh claim leaves it) held by
-- ARGV[1] with a live lease, is completed here with GET, TIME (and
-- PEXPIRETIME for N) and SET, without the codec; the reply is 1. Anything
-- else, or a string that does not check out field by field, goes on to
-- complete.lua, nothing written yet.
local fast_v = redis.pcall('GET', KEYS[1])
local fast_now, attempts, created, updated, lease, _, n, m = fast_owned(KEYS[1], fast_v, ARGV[1])
if fast_now then
  if fast_now >= lease then return 0 end -- lapsed: the owner is fenced
  local fplen
  if m < 255 then fplen = struct.pack('B', m) else fplen = struct.pack('>BI4', 255, m) end
  redis.call('SET', KEYS[1], '\193' .. struct.pack('>I4I6I6', attempts, created, math.max(fast_now, updated)) ..
    ARGV[4] .. fplen .. string.sub(fast_v, 39 + n) .. ARGV[3], 'PX', ARGV[2])
  return 1
end
