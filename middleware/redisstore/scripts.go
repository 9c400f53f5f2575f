package redisstore

import "github.com/redis/go-redis/v9"

// Hash fields: s state (P, C, F), o owner token (only while P), a attempts,
// f fingerprint, r result (only once C), c created and u updated (server ms).

// claimScript: KEYS[1] record; ARGV[1] token, ARGV[2] lease ms,
// ARGV[3] fingerprint ("" for none).
// Returns {1, attempts, created, updated, fingerprint} when acquired, else
// {0, state, attempts, created, updated, fingerprint, result}.
var claimScript = redis.NewScript(`
local rec = redis.call('HMGET', KEYS[1], 's', 'a', 'c', 'u', 'f', 'r')
local st, fp = rec[1], rec[5]
local mismatch = ARGV[3] ~= '' and fp and fp ~= '' and fp ~= ARGV[3]
if st and (st ~= 'F' or mismatch) then
  return {0, st, rec[2], rec[3], rec[4], fp, rec[6]}
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
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// finishScript: KEYS[1] record; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] new
// state (C or F), ARGV[4] result (stored only for C). Returns 1, or 0 when the
// token does not own the key.
var finishScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HDEL', KEYS[1], 'o')
if ARGV[3] == 'C' then
  redis.call('HSET', KEYS[1], 's', 'C', 'u', now, 'r', ARGV[4])
else
  redis.call('HSET', KEYS[1], 's', 'F', 'u', now)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)
