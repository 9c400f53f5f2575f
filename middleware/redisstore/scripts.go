package redisstore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Each transition is one Lua script, run by EVALSHA: one round trip, atomic
// on the server, touching only KEYS[1] (Cluster-safe). Every script holds
// prelude.lua, the record codec, whose header documents both layouts; each
// script's own header documents its KEYS, ARGV and reply.
//
// Claim, Renew and Complete start with a fast section (claimfast.lua,
// renewfast.lua, completefast.lua; the last two after ownedfast.lua, which
// reads the caller's IN_PROGRESS string for both) that settles their common
// cases with the fewest commands and returns before the codec's functions
// are even defined; every other case falls through to the codec and the
// full transition.

//go:embed prelude.lua
var prelude string

var (
	//go:embed ownedfast.lua
	ownedFastLua string
	//go:embed claimfast.lua
	claimFastLua string
	//go:embed renewfast.lua
	renewFastLua string
	//go:embed completefast.lua
	completeFastLua string
	//go:embed claim.lua
	claimLua string
	//go:embed renew.lua
	renewLua string
	//go:embed complete.lua
	completeLua string
	//go:embed fail.lua
	failLua string
	//go:embed release.lua
	releaseLua string
	//go:embed get.lua
	getLua string
	//go:embed unmark.lua
	unmarkLua string
)

var (
	claimScript    = redis.NewScript(claimFastLua + prelude + claimLua)
	renewScript    = redis.NewScript(ownedFastLua + renewFastLua + prelude + renewLua)
	completeScript = redis.NewScript(ownedFastLua + completeFastLua + prelude + completeLua)
	failScript     = redis.NewScript(prelude + failLua)
	releaseScript  = redis.NewScript(prelude + releaseLua)
	getScript      = redis.NewScript(prelude + getLua)
	unmarkScript   = redis.NewScript(unmarkLua)
)
