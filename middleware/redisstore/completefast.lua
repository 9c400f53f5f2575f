-- completefast.lua: the common case of Store.Complete, before codec.lua
-- and complete.lua in its script (same KEYS and ARGV). An IN_PROGRESS
-- string (P, or N as the plain claim leaves it) held by ARGV[1] with a
-- live lease is completed here with GET, TIME (and PEXPIRETIME for N) and
-- SET, before the codec's functions are even defined; the reply is 1.
-- Anything else, or a string that does not check out field by field
-- against codec.lua's layout, goes on to complete.lua, nothing written yet.
-- The package documentation has the figure that keeps it.
--
-- fast_owned reads v, the value under key, as an IN_PROGRESS string held
-- by token. It returns the server's time (TIME, ms), then attempts,
-- created, updated, the lease deadline, the retention and the lengths of
-- the owner and the fingerprint, when every field checks out; nil for
-- anything else (another value, another owner, an N record without an
-- expiry or with one moved later than codec.lua's NEW_AHEAD allows).
local function fast_owned(key, v, token)
  if type(v) ~= 'string' or #v < 38 or string.byte(v, 1) ~= 192 then return nil end
  local st = string.sub(v, 2, 2)
  local attempts, created, updated, lease, retain, n = struct.unpack('>I4I6I6I6I6I4', v, 3)
  if (st ~= 'P' and st ~= 'N') or n ~= #token or string.sub(v, 35, 34 + n) ~= token or attempts < 1 or
    lease < 1 or retain < 1 or #v < 38 + n then
    return nil
  end
  local m = struct.unpack('>I4', v, 35 + n)
  if #v ~= 38 + n + m then return nil end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if st == 'N' then
    if created ~= 0 or updated ~= 0 then return nil end
    -- The lease's deadline is the key's expiry minus the retention; created
    -- is the deadline minus the lease.
    created = redis.call('PEXPIRETIME', key) - retain - lease
    if created > now + 60000 then return nil end -- its expiry was moved (NEW_AHEAD)
    updated, lease = created, created + lease
  end
  if created < 1 or updated < created then return nil end
  return now, attempts, created, updated, lease, retain, n, m
end
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
