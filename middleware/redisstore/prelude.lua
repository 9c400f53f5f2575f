-- prelude.lua is the record codec that every script of redisstore starts
-- with (scripts.go prepends it); it is not a script on its own.
--
-- A record lives under its own key, KEYS[1], in one of two encodings.
--
-- IN_PROGRESS and FAILED: a HASH
--   s  'P' (IN_PROGRESS) or 'F' (FAILED)
--   o  while P, the owner token; while F, the token whose Fail made it F
--      (so that Fail resent by that owner succeeds), or absent when a
--      Release made it F (no resend matches it); never shown as F's
--   a  attempts, decimal, >= 1
--   c  created, server ms, > 0
--   u  updated, server ms, >= c
--   l  lease deadline, server ms (P only)
--   r  retention, ms: how long the record outlives its lease (the claim's
--      TTL), so that Renew can set the key's PEXPIRE to lease + r (P only)
--   f  fingerprint (absent when none)
-- A P record whose lease deadline has passed (now >= l) has lapsed: it reads
-- as FAILED with LeaseExpiresAt = l, a Claim takes it with a + 1, and its
-- owner is fenced. The key itself expires at l + r.
--
-- COMPLETED, most of the keys a busy service holds: a compact STRING
--   offset  size  field
--   0       1     tag 0xC1 (never a byte of UTF-8 text, so no text or JSON
--                 value can pass for a record)
--   1       4     attempts, big-endian, >= 1
--   5       6     created, big-endian server ms, > 0
--   11      6     updated, big-endian server ms, >= created
--   17      8     owner: the first 8 bytes of SHA-1 of the completing token
--                 (Complete resent by that owner succeeds)
--   25      1     fingerprint length n if < 255; 255 means a big-endian u32
--                 length (>= 255) follows
--   26 (30) n     fingerprint
--   ...     rest  result
-- The header is 26 bytes (30 with the long fingerprint length).
--
-- Anything else under the key (another type, a string without the tag or
-- too short, a hash without s or with non-numeric fields) is corrupt: the
-- script answers the error reply "IDEMPOTENCY_CORRUPT <reason>" and writes
-- nothing. Every check returns its reason instead of raising an error, so
-- the reply carries no script position and reads the same on every Redis
-- version.

local TAG = '\193'
local HEADER = 26
local MAX_U32 = 4294967295

local function corrupt(reason)
  return redis.error_reply('IDEMPOTENCY_CORRUPT ' .. reason)
end

-- now_ms is the server's clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- uint parses a decimal field strictly (digits only, exact in a double);
-- nil for a missing or malformed one.
local function uint(v)
  if type(v) ~= 'string' or #v > 15 or not string.find(v, '^%d+$') then
    return nil
  end
  return tonumber(v)
end

-- short_hash is the owner field of a COMPLETED string: the first 8 bytes of
-- SHA-1 of the token.
local function short_hash(token)
  local hex = redis.sha1hex(token)
  return struct.pack('>I4I4', tonumber(string.sub(hex, 1, 8), 16), tonumber(string.sub(hex, 9, 16), 16))
end

-- check_times validates the fields every record has.
local function check_times(rec)
  if not rec.attempts or rec.attempts < 1 or rec.attempts > MAX_U32 then return 'bad attempts' end
  if not rec.created or rec.created < 1 then return 'bad created time' end
  if not rec.updated or rec.updated < rec.created then return 'bad updated time' end
  return nil
end

local function load_hash(key)
  local h = redis.call('HMGET', key, 's', 'o', 'a', 'c', 'u', 'l', 'r', 'f')
  local rec = {state = h[1], owner = h[2] or '', attempts = uint(h[3]),
    created = uint(h[4]), updated = uint(h[5]), fp = h[8] or ''}
  if rec.state ~= 'P' and rec.state ~= 'F' then return nil, 'hash: bad state' end
  local bad = check_times(rec)
  if bad then return nil, 'hash: ' .. bad end
  if h[6] then
    rec.lease = uint(h[6])
    if not rec.lease or rec.lease < 1 then return nil, 'hash: bad lease deadline' end
  end
  if h[7] then
    rec.retain = uint(h[7])
    if not rec.retain or rec.retain < 1 then return nil, 'hash: bad retention' end
  end
  if rec.state == 'P' then
    if rec.owner == '' then return nil, 'hash: in progress without owner' end
    if not rec.lease then return nil, 'hash: in progress without lease deadline' end
    if not rec.retain then return nil, 'hash: in progress without retention' end
  else
    rec.lease = nil -- a FAILED record has ended its lease
  end
  return rec
end

-- load_string decodes a COMPLETED record; full also reads the result,
-- otherwise only the header and the length are read.
local function load_string(key, full)
  local v, total
  if full then
    v = redis.call('GET', key)
    total = #v
  else
    v = redis.call('GETRANGE', key, 0, HEADER + 3)
    total = redis.call('STRLEN', key)
  end
  if #v < HEADER then return nil, 'string: too short' end
  if string.sub(v, 1, 1) ~= TAG then return nil, 'string: unknown tag' end
  local rec = {state = 'C'}
  rec.attempts, rec.created, rec.updated = struct.unpack('>I4I6I6', v, 2)
  rec.owner = string.sub(v, 18, 25)
  local n, pos = struct.unpack('B', v, 26)
  if n == 255 then
    if #v < HEADER + 4 then return nil, 'string: too short' end
    n, pos = struct.unpack('>I4', v, pos)
    if n < 255 then return nil, 'string: bad fingerprint length' end
  end
  if pos - 1 + n > total then return nil, 'string: fingerprint overruns the value' end
  local bad = check_times(rec)
  if bad then return nil, 'string: ' .. bad end
  if full then
    rec.fp = string.sub(v, pos, pos + n - 1)
    rec.result = string.sub(v, pos + n)
  end
  return rec
end

-- load returns the record under key: nil when the key is absent, or nil and
-- a reason when the value is not a record.
local function load(key, full)
  local t = redis.call('TYPE', key).ok
  if t == 'none' then return nil end
  if t == 'hash' then return load_hash(key) end
  if t == 'string' then return load_string(key, full) end
  return nil, 'wrong type ' .. t
end

local function lapsed(rec, now)
  return rec.state == 'P' and now >= rec.lease
end

-- reply is a record as the Go side reads it:
--   {state, attempts, created, updated, lease, fingerprint, result, token}
-- state 'P', 'F' or 'C' (a lapsed lease reads 'F'); lease the deadline of a
-- live or lapsed lease, else 0; result '' unless 'C'; token the owner's
-- while 'P' and show_token, else ''. Empty strings, never nil or false, so
-- RESP2 and RESP3 read the same.
local function reply(rec, now, show_token)
  if rec.state == 'C' then
    return {'C', rec.attempts, rec.created, rec.updated, 0, rec.fp, rec.result, ''}
  end
  if rec.state == 'F' then
    return {'F', rec.attempts, rec.created, rec.updated, 0, rec.fp, '', ''}
  end
  if lapsed(rec, now) then
    return {'F', rec.attempts, rec.created, rec.updated, rec.lease, rec.fp, '', ''}
  end
  return {'P', rec.attempts, rec.created, rec.updated, rec.lease, rec.fp, '', show_token and rec.owner or ''}
end

local function encode_completed(rec, owner, updated, result)
  local n = #rec.fp
  local fplen
  if n < 255 then fplen = struct.pack('B', n) else fplen = struct.pack('>BI4', 255, n) end
  return TAG .. struct.pack('>I4I6I6', rec.attempts, rec.created, updated) .. owner .. fplen .. rec.fp .. result
end
