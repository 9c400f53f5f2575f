-- renewfast.lua: the fast section of Store.Renew, before prelude.lua and
-- renew.lua (same KEYS and ARGV). The common case, an IN_PROGRESS string
-- held by ARGV[1] with a live lease, is renewed here with GET, TIME and
-- SET, without the codec; the reply is 1. Anything else, or a string that
-- does not check out field by field, goes on to renew.lua, nothing written
-- yet.
local fast_v = redis.pcall('GET', KEYS[1])
if type(fast_v) == 'string' and #fast_v >= 38 and string.sub(fast_v, 1, 2) == '\192P' then
  local attempts, created, updated, lease, retain, n = struct.unpack('>I4I6I6I6I6I4', fast_v, 3)
  if n == #ARGV[1] and string.sub(fast_v, 35, 34 + n) == ARGV[1] and attempts >= 1 and created >= 1 and
    updated >= created and lease >= 1 and retain >= 1 and #fast_v >= 38 + n and
    #fast_v == 38 + n + struct.unpack('>I4', fast_v, 35 + n) then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if now >= lease then return 0 end -- lapsed: the owner is fenced
    local d = tonumber(ARGV[2])
    redis.call('SET', KEYS[1], string.sub(fast_v, 1, 18) .. struct.pack('>I6', now + d) .. string.sub(fast_v, 25), 'PX', d + retain)
    return 1
  end
end
