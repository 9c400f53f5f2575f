-- get.lua: Store.Get, after codec.lua; reads only.
--
-- KEYS[1]  the record
--
-- Reply: {} when the key is absent, else {state, attempts, created,
-- updated, lease, fingerprint, result, token} as codec.lua's reply() lays it
-- out, with the owner's token while IN_PROGRESS. A corrupt value: the error
-- reply IDEMPOTENCY_CORRUPT.
local rec, bad = load(KEYS[1], true)
if bad then return corrupt(bad) end
if not rec then return {} end
return reply(rec, now_ms(), true)
