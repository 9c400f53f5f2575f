package redisstore

import (
	"strings"

	"github.com/redis/go-redis/v9"
)

// claimScriptBefore7 is claimScript with its fast section on the path it
// takes on Redis 5 and 6 (GET, then SET), which the tests' Redis 7 would
// not take.
var claimScriptBefore7 = func() *redis.Script {
	const on7 = "if redis.REDIS_VERSION_NUM then"
	if !strings.Contains(claimFastLua, on7) {
		panic("claimfast.lua no longer tests the Redis version")
	}
	return redis.NewScript(strings.Replace(claimFastLua, on7, "if false then", 1) + prelude + claimLua)
}()

// ClaimAsBefore7 makes s claim on the path the fast section takes on
// Redis 5 and 6.
func ClaimAsBefore7(s *Store) { s.claim = claimScriptBefore7; s.scriptClaims.Store(true) }

// ClaimWithScriptOnly makes s claim with claim.lua alone, as on a server
// that refused the fresh claim's SET.
func ClaimWithScriptOnly(s *Store) { s.scriptClaims.Store(true) }

// ClaimsWithScriptOnly reports whether s has gone over to claim.lua alone.
func ClaimsWithScriptOnly(s *Store) bool { return s.scriptClaims.Load() }

// AddFreshClaimArgs adds args to the fresh claim's SET, so that a test can
// make the server refuse it as a server before Redis 7 does.
func AddFreshClaimArgs(s *Store, args ...any) { s.freshClaimArgs = append(s.freshClaimArgs, args...) }
