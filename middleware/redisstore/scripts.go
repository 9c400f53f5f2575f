package redisstore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Each transition is one Lua script, run by EVALSHA: one round trip, atomic
// on the server, touching only KEYS[1] (Cluster-safe). Every script starts
// with prelude.lua, the record codec, whose header documents both
// encodings; each script's own header documents its KEYS, ARGV and reply.

//go:embed prelude.lua
var prelude string

var (
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
	claimScript    = redis.NewScript(prelude + claimLua)
	renewScript    = redis.NewScript(prelude + renewLua)
	completeScript = redis.NewScript(prelude + completeLua)
	failScript     = redis.NewScript(prelude + failLua)
	releaseScript  = redis.NewScript(prelude + releaseLua)
	getScript      = redis.NewScript(prelude + getLua)
	unmarkScript   = redis.NewScript(unmarkLua)
)
