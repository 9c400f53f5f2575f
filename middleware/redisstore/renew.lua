-- renew.lua: Store.Renew, after codec.lua.
--
-- KEYS[1]  the record
-- ARGV[1]  owner token
-- ARGV[2]  lease, ms (> 0)
-- ARGV[3]  the token's owner field in a COMPLETED string (see complete.lua)
--
-- Reply: 1 when the token holds a live lease, now ending ARGV[2] from now
-- (the key then expires the record's retention after that); 2 when the
-- record is COMPLETED by this token (its owner completed it: the lease
-- ended, nobody took it); 0 otherwise (absent, COMPLETED by another,
-- FAILED, another owner, or a lapsed lease). A resent Renew simply renews
-- again. A corrupt value: the error reply IDEMPOTENCY_CORRUPT, nothing
-- written.
local rec, bad = load(KEYS[1], false)
if bad then return corrupt(bad) end
if rec and rec.state == 'C' and rec.owner == ARGV[3] then return 2 end
if not rec or rec.state ~= 'P' or rec.owner ~= ARGV[1] then return 0 end
local now = now_ms()
if lapsed(rec, now) then return 0 end
local lease = tonumber(ARGV[2])
rec.lease = now + lease
store_pf(KEYS[1], rec, lease + rec.retain)
return 1
