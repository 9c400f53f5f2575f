-- fail.lua: Store.Fail, after codec.lua.
--
-- KEYS[1]  the record
-- ARGV[1]  owner token
-- ARGV[2]  TTL of the FAILED record, ms (> 0)
--
-- Reply: 1 when the token held a live lease and the record is now FAILED,
-- or when the record is FAILED by this token and not claimed since (a
-- resent Fail: nothing changes); 0 otherwise. A corrupt value: the error
-- reply IDEMPOTENCY_CORRUPT, nothing written.
local rec, bad = load(KEYS[1], false)
if bad then return corrupt(bad) end
if not rec or rec.state == 'C' or rec.owner ~= ARGV[1] then return 0 end
if rec.state == 'F' then return 1 end
local now = now_ms()
if lapsed(rec, now) then return 0 end
-- The owner stays the failing token, for a resent Fail; the lease is over.
rec.state, rec.updated, rec.lease, rec.retain = 'F', math.max(now, rec.updated), nil, nil
store_pf(KEYS[1], rec, ARGV[2])
return 1
