-- completefast.lua: the fast section of Store.Complete, before prelude.lua
-- and complete.lua (same KEYS and ARGV). The common case, an IN_PROGRESS
-- string (P, or N as a fresh claim leaves it) held by ARGV[1] with a live
-- lease, is completed here with GET, TIME (and PEXPIRETIME for N) and SET, without
-- the codec; the reply is 1. Anything else, or a string that does not check
-- out field by field, goes on to complete.lua, nothing written yet.
local fast_v = redis.pcall('GET', KEYS[1])
if type(fast_v) == 'string' and #fast_v >= 38 and string.byte(fast_v, 1) == 192 then
  local st = string.sub(fast_v, 2, 2)
  local attempts, created, updated, lease, retain, n = struct.unpack('>I4I6I6I6I6I4', fast_v, 3)
  if (st == 'P' or st == 'N') and n == #ARGV[1] and string.sub(fast_v, 35, 34 + n) == ARGV[1] and attempts >= 1 and
    lease >= 1 and retain >= 1 and #fast_v >= 38 + n then
    local m = struct.unpack('>I4', fast_v, 35 + n)
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if st == 'N' and created == 0 and updated == 0 then
      -- The lease's deadline is the key's expiry minus the retention; created
      -- is the deadline minus the lease (prelude.lua). An N record without
      -- an expiry, or with one moved later, is not one this section settles.
      created = redis.call('PEXPIRETIME', KEYS[1]) - retain - lease
      updated, lease = created, created + lease
      if created > now + 60000 then created = 0 end -- its expiry was moved (prelude.lua's NEW_AHEAD)
    elseif st == 'N' then
      created = 0
    end
    if #fast_v == 38 + n + m and created >= 1 and updated >= created then
      if now >= lease then return 0 end -- lapsed: the owner is fenced
      local fplen
      if m < 255 then fplen = struct.pack('B', m) else fplen = struct.pack('>BI4', 255, m) end
      redis.call('SET', KEYS[1], '\193' .. struct.pack('>I4I6I6', attempts, created, math.max(now, updated)) ..
        ARGV[4] .. fplen .. string.sub(fast_v, 39 + n) .. ARGV[3], 'PX', ARGV[2])
      return 1
    end
  end
end
