package testserver

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// QuietRedisLogs drops go-redis's own log lines for the whole test binary:
// the failed dials and retries while a test's server is down on purpose.
// Tests assert on outcomes instead. Call it from TestMain.
func QuietRedisLogs() { redis.SetLogger(quietRedis{}) }

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
