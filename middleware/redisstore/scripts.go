package redisstore

import "github.com/redis/go-redis/v9"

// An IN_PROGRESS or FAILED record is a HASH with fields: s state (P, F), o
// owner token (only while P), a attempts, f fingerprint, c created and u
// updated (server ms).
//
// A COMPLETED record, most of the keys a busy service holds, is a STRING:
//
//	'C' attempts:u32 created:u48 updated:u48 fplen fingerprint result
//
// (big-endian; fplen is one byte below 255, else 255 and a u32), so that a
// completed key without output costs a fifth less memory than the
// hash (a listpack of field names and 13-digit numbers). Every script
// reads the owner token with pcall, so a string key simply has no owner.

// decodeCompleted defines completed(key): the record of a COMPLETED key (a
// string) as {'C', attempts, created, updated, fingerprint, result}.
const decodeCompleted = `
local function completed(key)
  local v = redis.call('GET', key)
  local a, c, u, n, pos = struct.unpack('>I4I6I6B', v, 2)
  if n == 255 then n, pos = struct.unpack('>I4', v, pos) end
  return {'C', a, c, u, string.sub(v, pos, pos + n - 1), string.sub(v, pos + n)}
end
`

// getScript: KEYS[1] record. Returns nil for an absent key, else
// {state, attempts, created, updated, fingerprint, result, token}.
var getScript = redis.NewScript(decodeCompleted + `
local rec = redis.pcall('HMGET', KEYS[1], 's', 'a', 'c', 'u', 'f', 'o')
if rec.err then return completed(KEYS[1]) end
if not rec[1] then return false end
return {rec[1], rec[2], rec[3], rec[4], rec[5], false, rec[6]}
`)

// claimScript: KEYS[1] record; ARGV[1] token, ARGV[2] lease ms,
// ARGV[3] fingerprint ("" for none).
// Returns {1, attempts, created, updated, fingerprint} when acquired, else
// {0, state, attempts, created, updated, fingerprint, result}.
var claimScript = redis.NewScript(decodeCompleted + `
local rec = redis.pcall('HMGET', KEYS[1], 's', 'a', 'c', 'u', 'f')
if rec.err then
  local c = completed(KEYS[1])
  return {0, c[1], c[2], c[3], c[4], c[5], c[6]}
end
local st, fp = rec[1], rec[5]
local mismatch = ARGV[3] ~= '' and fp and fp ~= '' and fp ~= ARGV[3]
if st and (st ~= 'F' or mismatch) then
  return {0, st, rec[2], rec[3], rec[4], fp}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local attempts, created = 1, now
if st then
  attempts = tonumber(rec[2]) + 1
  created = tonumber(rec[3])
end
if ARGV[3] ~= '' then fp = ARGV[3] end
redis.call('HSET', KEYS[1], 's', 'P', 'o', ARGV[1], 'a', attempts, 'c', created, 'u', now)
if fp and fp ~= '' then redis.call('HSET', KEYS[1], 'f', fp) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, attempts, created, now, fp}
`)

// renewScript: KEYS[1] record; ARGV[1] token, ARGV[2] lease ms. Returns 1, or
// 0 when the token does not own the key.
var renewScript = redis.NewScript(`
if redis.pcall('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// finishScript: KEYS[1] record; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] new
// state (C or F), ARGV[4] result (stored only for C). Returns 1, or 0 when the
// token does not own the key.
var finishScript = redis.NewScript(`
if redis.pcall('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[3] == 'C' then
  local rec = redis.call('HMGET', KEYS[1], 'a', 'c', 'f')
  local fp = rec[3] or ''
  local fplen = #fp < 255 and struct.pack('B', #fp) or struct.pack('>BI4', 255, #fp)
  redis.call('SET', KEYS[1], 'C' .. struct.pack('>I4I6I6', tonumber(rec[1]), tonumber(rec[2]), now) .. fplen .. fp .. ARGV[4], 'PX', ARGV[2])
  return 1
end
redis.call('HDEL', KEYS[1], 'o')
redis.call('HSET', KEYS[1], 's', 'F', 'u', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)
