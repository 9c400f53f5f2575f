-- renewfast.lua: the fast section of Store.Renew, after ownedfast.lua and
-- before prelude.lua and renew.lua (same KEYS and ARGV). The common case, an
-- IN_PROGRESS string (P, or N as a fresh claim leaves it) held by ARGV[1]
-- with a live lease, is renewed here with GET, TIME (and PEXPIRETIME for N)
-- and SET, without the codec; an N record is written as the P string. The
-- reply is 1. Anything else, or a string that does not check out field by
-- field, goes on to renew.lua, nothing written yet.
local fast_v = redis.pcall('GET', KEYS[1])
local fast_now, attempts, created, updated, lease, retain = fast_owned(KEYS[1], fast_v, ARGV[1])
if fast_now then
  if fast_now >= lease then return 0 end -- lapsed: the owner is fenced
  local d = tonumber(ARGV[2])
  redis.call('SET', KEYS[1], '\192P' .. struct.pack('>I4I6I6I6', attempts, created, updated, fast_now + d) ..
    string.sub(fast_v, 25), 'PX', d + retain)
  return 1
end
