-- claimfast.lua: the fast section of Store.Claim, before prelude.lua and
-- claim.lua (same KEYS and ARGV). It settles the two common cases with one
-- command besides TIME, without the codec:
--   - an absent key: the new IN_PROGRESS string is written (SET NX GET),
--     and the reply is the server time of the claim, an integer: the
--     record is attempt 1, created, updated at that time, its lease ending
--     ARGV[2] later, held by ARGV[1], with ARGV[4] as its fingerprint;
--   - a COMPLETED string: the reply is that string as it is, which the Go
--     side decodes and validates as prelude.lua's load_string does; nothing
--     is written.
-- Anything else (an IN_PROGRESS or FAILED record, a corrupt value or
-- another type) goes on to claim.lua, nothing written yet.
local fast_t = redis.call('TIME')
local fast_now = tonumber(fast_t[1]) * 1000 + math.floor(tonumber(fast_t[2]) / 1000)
local fast_lease, fast_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local fast_rec = '\192P' .. struct.pack('>I4I6I6I6I6I4', 1, fast_now, fast_now, fast_now + fast_lease, fast_ttl, #ARGV[1]) ..
  ARGV[1] .. struct.pack('>I4', #ARGV[4]) .. ARGV[4]
local fast_v = redis.pcall('SET', KEYS[1], fast_rec, 'NX', 'PX', fast_lease + fast_ttl, 'GET')
if fast_v == false then return fast_now end
if type(fast_v) == 'string' and string.byte(fast_v, 1) == 193 then return fast_v end
