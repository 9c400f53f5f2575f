-- deleteif.lua: Store.DeleteIf, after codec.lua.
--
-- KEYS[1]  the record
-- ARGV[1]  the states to delete, as letters: 'P' (IN_PROGRESS with a live
--          lease), 'F' (FAILED, or a lease that lapsed), 'C' (COMPLETED)
--
-- Reply: {deleted, state}: deleted 1 when the key was deleted, else 0;
-- state the letter of the record found ('A' when the key is absent, a
-- lapsed lease reads 'F'). A corrupt value: the error reply
-- IDEMPOTENCY_CORRUPT, nothing deleted.
local rec, bad = load(KEYS[1], false)
if bad then return corrupt(bad) end
if not rec then return {0, 'A'} end
local state = rec.state
if lapsed(rec, now_ms()) then state = 'F' end
if string.find(ARGV[1], state, 1, true) then
  redis.call('DEL', KEYS[1])
  return {1, state}
end
return {0, state}
