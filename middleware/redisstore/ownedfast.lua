-- ownedfast.lua: the head of renewfast.lua and completefast.lua, before
-- them in their scripts. fast_owned reads v, the value under key, as an
-- IN_PROGRESS string held by token: P, or N as a fresh claim leaves it,
-- with its times from the key's expiry (prelude.lua). It returns the
-- server's time (TIME, ms), then attempts, created, updated, the lease
-- deadline, the retention and the lengths of the owner and the fingerprint,
-- when every field checks out; nil for anything else (another value, another
-- owner, an N record without an expiry or with one moved later than
-- prelude.lua's NEW_AHEAD allows), which the codec then reads.
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
