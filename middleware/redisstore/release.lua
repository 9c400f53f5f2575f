-- release.lua: Store.Release, after codec.lua.
--
-- KEYS[1]  the record
-- ARGV[1]  owner token (non-empty)
--
-- Reply: 1 when the token held a live lease and the claim is undone: the key
-- is deleted if the claim was attempt 1, else it is FAILED again with one
-- attempt fewer, no owner (so nobody's resent Fail or Complete matches it),
-- no lease fields, and an expiry of the claim's TTL (its retention) from now. 0 when
-- nothing changed: the key is absent, COMPLETED, FAILED, held by another
-- token, or its lease lapsed (a resent Release lands here). A corrupt value:
-- the error reply IDEMPOTENCY_CORRUPT, nothing written.
local rec, bad = load(KEYS[1], false)
if bad then return corrupt(bad) end
if not rec or rec.state ~= 'P' or rec.owner ~= ARGV[1] then return 0 end
local now = now_ms()
if lapsed(rec, now) then return 0 end
if rec.attempts == 1 then
  redis.call('DEL', KEYS[1])
  return 1
end
-- created and the fingerprint stay as the claim left them; updated records
-- this transition.
local retain = rec.retain
rec.state, rec.owner, rec.attempts, rec.updated, rec.lease, rec.retain = 'F', '', rec.attempts - 1, math.max(now, rec.updated), nil, nil
store_pf(KEYS[1], rec, retain)
return 1
