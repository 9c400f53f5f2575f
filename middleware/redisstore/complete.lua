-- complete.lua: Store.Complete, after completefast.lua and codec.lua: the
-- cases its common case leaves.
--
-- KEYS[1]  the record
-- ARGV[1]  owner token
-- ARGV[2]  TTL of the COMPLETED record, ms (> 0)
-- ARGV[3]  result (any bytes, possibly empty)
-- ARGV[4]  the owner field of the COMPLETED string: the first 8 bytes of
--          SHA-1 of the token
--
-- Reply: 1 when the token held a live lease and the record is now the
-- COMPLETED string, or when the record is already COMPLETED by this token
-- (a resent Complete: nothing changes); 0 otherwise. A corrupt value: the
-- error reply IDEMPOTENCY_CORRUPT, nothing written.
local rec, bad = load(KEYS[1], false)
if bad then return corrupt(bad) end
if not rec then return 0 end
local owner = ARGV[4]
if rec.state == 'C' then
  if rec.owner == owner then return 1 end
  return 0
end
if rec.state ~= 'P' or rec.owner ~= ARGV[1] then return 0 end
local now = now_ms()
if lapsed(rec, now) then return 0 end
redis.call('SET', KEYS[1], encode_completed(rec, owner, math.max(now, rec.updated), ARGV[3]), 'PX', ARGV[2])
return 1
