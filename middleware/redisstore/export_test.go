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
func ClaimAsBefore7(s *Store) { s.claim = claimScriptBefore7 }
