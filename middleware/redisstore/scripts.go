package redisstore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Each script starts with codec.lua and documents its KEYS, ARGV and reply.

//go:embed codec.lua
var codec string

var (
	//go:embed claim.lua
	claimLua string
	//go:embed renew.lua
	renewLua string
	//go:embed completefast.lua
	completeFastLua string
	//go:embed complete.lua
	completeLua string
	//go:embed fail.lua
	failLua string
	//go:embed release.lua
	releaseLua string
	//go:embed get.lua
	getLua string
	//go:embed deleteif.lua
	deleteIfLua string
	//go:embed unmark.lua
	unmarkLua string
)

var (
	claimScript    = redis.NewScript(codec + claimLua)
	renewScript    = redis.NewScript(codec + renewLua)
	completeScript = redis.NewScript(completeFastLua + codec + completeLua)
	failScript     = redis.NewScript(codec + failLua)
	releaseScript  = redis.NewScript(codec + releaseLua)
	getScript      = redis.NewScript(codec + getLua)
	deleteIfScript = redis.NewScript(codec + deleteIfLua)
	unmarkScript   = redis.NewScript(unmarkLua)
)
