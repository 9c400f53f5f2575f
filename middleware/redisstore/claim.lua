-- claim.lua: Store.Claim, after codec.lua: the keys that the plain claim
-- (SET NX GET, Go side) leaves, with every state.
--
-- KEYS[1]  the record
-- ARGV[1]  owner token (non-empty)
-- ARGV[2]  lease, ms (> 0)
-- ARGV[3]  TTL: how long the record outlives its lease, ms (> 0)
-- ARGV[4]  fingerprint, '' for none
--
-- Reply: {acquired, state, attempts, created, updated, lease, fingerprint,
-- result, token}: acquired 1 or 0, then the record as codec.lua's reply()
-- lays it out (the new IN_PROGRESS record with its token when acquired; the
-- record that refused the claim, without a token, otherwise). A corrupt
-- value: the error reply IDEMPOTENCY_CORRUPT, nothing written.
local rec, bad = load(KEYS[1], true)
if bad then return corrupt(bad) end
local token, lease, ttl, fp = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local now = now_ms()

local function refuse()
  local r = reply(rec, now, false)
  table.insert(r, 1, 0)
  return r
end

local attempts, created, updated = 1, now, now
if rec then
  if fp ~= '' and rec.fp ~= '' and rec.fp ~= fp then return refuse() end
  if rec.state == 'C' then return refuse() end
  if rec.state == 'P' and not lapsed(rec, now) then
    if rec.owner ~= token then return refuse() end
    -- This very claim, resent after its reply was lost: the same record,
    -- no new attempt, the lease counted from now.
    rec.lease, rec.retain = now + lease, ttl
    store_pf(KEYS[1], rec, lease + ttl)
    return {1, 'P', rec.attempts, rec.created, rec.updated, now + lease, rec.fp, '', token}
  end
  -- FAILED, or a lease that lapsed: one more attempt of the same record,
  -- counted no further than the 4 bytes of the string hold (one more would
  -- be written as 0, a record the codec refuses).
  attempts = math.min(rec.attempts + 1, MAX_U32)
  created = rec.created
  updated = math.max(now, rec.updated) -- a clock stepped back keeps updated >= created
  if fp == '' then fp = rec.fp end
end
store_pf(KEYS[1], {state = 'P', owner = token, attempts = attempts, created = created, updated = updated,
  lease = now + lease, retain = ttl, fp = fp}, lease + ttl)
return {1, 'P', attempts, created, updated, now + lease, fp, '', token}
