-- codec.lua is the record codec that every script of redisstore starts
-- with (scripts.go prepends it); it is not a script on its own. codec.go
-- is its Go half (the plain claim's N record, a COMPLETED record's decoding).
--
-- A record lives under its own key, KEYS[1], as a STRING in one of two
-- layouts (all integers big-endian, times in server ms):
--
-- IN_PROGRESS and FAILED
--   offset  size  field
--   0       1     tag 0xC0 (never a byte of UTF-8 text)
--   1       1     state 'P' (IN_PROGRESS) or 'F' (FAILED)
--   2       4     attempts, >= 1 (a claim counts no further than 2^32 - 1)
--   6       6     created, > 0
--   12      6     updated, >= created
--   18      6     lease deadline (P: > 0; F: 0)
--   24      6     retention, ms: how long the record outlives its lease
--                 (the claim's TTL), so that Renew can set the key's expiry
--                 to lease + retention (P: > 0; F: 0)
--   30      4     owner length n: while P, the owner token (n > 0); while
--                 F, the token whose Fail made it F (so that Fail resent by
--                 that owner succeeds), or none (n = 0) when a Release made
--                 it F; never shown as F's
--   34      n     owner
--   34+n    4     fingerprint length m
--   38+n    m     fingerprint; the value ends here (38 + n + m bytes)
-- A P record whose lease deadline has passed (now >= deadline) has lapsed:
-- it reads as FAILED with LeaseExpiresAt = the deadline, a Claim takes it
-- with attempts + 1, and its owner is fenced. The key itself expires at the
-- deadline + retention.
--
-- A fresh claim is one plain SET NX PX GET from the Go side,
-- which cannot read the server's clock: it writes state 'N' (new), the P
-- layout with created and updated 0 and, at offset 18, the lease's length
-- in ms instead of its deadline. Its times come from the key's expiry, set
-- by the server's clock: the SET's PX is lease + retention, so the lease
-- deadline is PEXPIRETIME - retention, and
-- created = updated = deadline - lease. The codec reads an N record as
-- that P record, and its next transition writes the P string. An N
-- without an expiry is corrupt, and so is one whose created time would be
-- more than a minute after the server's clock (NEW_AHEAD): its expiry was
-- moved later, which would move its lease as far (a key claimed for as
-- long as an operator's EXPIRE says).
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
-- Anything else under the key (another type, a hash included, a string
-- without a tag, too short or of the wrong length) is corrupt: the script
-- answers the error reply "IDEMPOTENCY_CORRUPT <reason>" and writes
-- nothing. Every check returns its reason instead of raising an error, so
-- the reply carries no script position and reads the same on every Redis
-- version.

local TAG = '\193'
local HEADER = 26
local PF_TAG = '\192'
local PF_HEADER = 38
local MAX_U32 = 4294967295

local function corrupt(reason)
  return redis.error_reply('IDEMPOTENCY_CORRUPT ' .. reason)
end

-- now_ms is the server's clock in milliseconds, read once per script.
local clock
local function now_ms()
  if not clock then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return clock
end

-- check_times validates the fields every record has.
local function check_times(rec)
  if rec.attempts < 1 or rec.attempts > MAX_U32 then return 'bad attempts' end
  if rec.created < 1 then return 'bad created time' end
  if rec.updated < rec.created then return 'bad updated time' end
  return nil
end

-- NEW_AHEAD is how far past the server's clock the created time of an N
-- record may read (ms) before the record is corrupt: an allowance for a
-- clock stepped back, beyond which its key's expiry was moved later (by an
-- operator's EXPIRE, say), which would move its lease as far.
local NEW_AHEAD = 60000

-- new_times returns the created time and the lease deadline of an N
-- record under key whose lease is lease ms and retention retain ms (see
-- the layout above), or nil and a reason: without an expiry, or with one
-- moved so far that the record would have been created more than
-- NEW_AHEAD in the future.
local function new_times(key, lease, retain)
  local deadline = redis.call('PEXPIRETIME', key) - retain
  if deadline - lease < 1 then return nil, 'string: new record without expiry' end
  if deadline - lease > now_ms() + NEW_AHEAD then return nil, 'string: new record whose expiry was moved' end
  return deadline - lease, deadline
end

-- load_pf decodes an IN_PROGRESS or FAILED string under key.
local function load_pf(key, v)
  if #v < PF_HEADER then return nil, 'string: too short' end
  local rec = {state = string.sub(v, 2, 2)}
  local lease, retain, n, pos
  rec.attempts, rec.created, rec.updated, lease, retain, n, pos = struct.unpack('>I4I6I6I6I6I4', v, 3)
  if rec.state == 'N' then
    if rec.created ~= 0 or rec.updated ~= 0 then return nil, 'string: new record with times' end
    if lease < 1 then return nil, 'string: new record without lease' end
    if retain < 1 then return nil, 'string: in progress without retention' end
    local created, deadline = new_times(key, lease, retain) -- deadline: the reason when created is nil
    if not created then return nil, deadline end
    rec.state, rec.created, rec.updated, lease = 'P', created, created, deadline
  end
  if rec.state ~= 'P' and rec.state ~= 'F' then return nil, 'string: bad state' end
  if pos + n + 3 > #v then return nil, 'string: owner overruns the value' end
  rec.owner = string.sub(v, pos, pos + n - 1)
  local m
  m, pos = struct.unpack('>I4', v, pos + n)
  if pos - 1 + m ~= #v then return nil, 'string: fingerprint length does not match the value' end
  rec.fp = string.sub(v, pos)
  local bad = check_times(rec)
  if bad then return nil, 'string: ' .. bad end
  if rec.state == 'P' then
    if n == 0 then return nil, 'string: in progress without owner' end
    if lease < 1 then return nil, 'string: in progress without lease deadline' end
    if retain < 1 then return nil, 'string: in progress without retention' end
    rec.lease, rec.retain = lease, retain
  elseif lease ~= 0 or retain ~= 0 then
    return nil, 'string: failed with a lease'
  end
  return rec
end

-- load_string decodes v, the start of a COMPLETED string of total bytes;
-- full (v is then the whole value) also reads the fingerprint and result.
local function load_string(v, total, full)
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

-- PEEK is how many bytes a partial read takes: an IN_PROGRESS or FAILED
-- record whole (unless its token and fingerprint are long), a COMPLETED
-- record's header without its result.
local PEEK = 512

-- load returns the record under key: nil when the key is absent, or nil and
-- a reason when the value is not a record. full reads a COMPLETED record's
-- result too. The common case is one read.
local function load(key, full)
  local v
  if full then v = redis.pcall('GET', key) else v = redis.pcall('GETRANGE', key, 0, PEEK - 1) end
  if type(v) == 'table' then return nil, 'wrong type ' .. redis.call('TYPE', key).ok end
  if not v or (v == '' and redis.call('EXISTS', key) == 0) then return nil end
  local partial = not full and #v == PEEK
  if string.sub(v, 1, 1) == PF_TAG then
    if partial then v = redis.call('GET', key) end
    return load_pf(key, v)
  end
  local total = #v
  if partial then total = redis.call('STRLEN', key) end
  return load_string(v, total, full)
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

-- encode_pf is the IN_PROGRESS or FAILED string of rec: its state,
-- attempts, created, updated, lease deadline and retention (0 when absent),
-- owner ('' for none) and fingerprint.
local function encode_pf(rec)
  return PF_TAG .. rec.state .. struct.pack('>I4I6I6I6I6I4', rec.attempts, rec.created, rec.updated,
    rec.lease or 0, rec.retain or 0, #rec.owner) .. rec.owner .. struct.pack('>I4', #rec.fp) .. rec.fp
end

-- store_pf writes rec as the IN_PROGRESS or FAILED string, expiring px ms
-- from now.
local function store_pf(key, rec, px)
  redis.call('SET', key, encode_pf(rec), 'PX', px)
end
