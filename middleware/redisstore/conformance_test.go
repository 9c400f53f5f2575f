package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

func TestConformanceStandalone(t *testing.T) {
	client := testserver.RedisClient(t)
	storetest.Run(t, subjects(client))
}

// TestConformanceClaimScriptOnly runs the suite with every claim in
// claim.lua, as a key that the plain
// claim does not settle takes it.
func TestConformanceClaimScriptOnly(t *testing.T) {
	storetest.Run(t, scriptClaimSubjects(testserver.RedisClient(t), redisstore.ClaimWithScriptOnly))
}

// scriptClaimSubjects returns storetest subjects on client whose claims
// setup sends to claim.lua; their fresh claims read the server's clock, so
// the suite compares their times exactly.
func scriptClaimSubjects(client redis.UniversalClient, setup func(*redisstore.Store)) func(t *testing.T) storetest.Subject {
	return func(t *testing.T) storetest.Subject {
		s, err := redisstore.New(client, nil)
		require.NoError(t, err)
		setup(s)
		return storetest.Subject{Store: s, PutForeign: putForeign(client)}
	}
}

func TestConformanceCluster(t *testing.T) {
	addrs := testserver.StartRedisCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	storetest.Run(t, subjects(client))
}

func TestConformanceUniversalClient(t *testing.T) {
	client := redis.NewUniversalClient(&redis.UniversalOptions{ContextTimeoutEnabled: true, Addrs: []string{testserver.RedisAddr(t)}})
	t.Cleanup(func() { _ = client.Close() })
	storetest.Run(t, subjects(client))
}

// subjects returns storetest subjects on client, able to write foreign
// values through the same client.
func subjects(client redis.UniversalClient) func(t *testing.T) storetest.Subject {
	return func(t *testing.T) storetest.Subject {
		s, err := redisstore.New(client, nil)
		require.NoError(t, err)
		return storetest.Subject{Store: s, PutForeign: putForeign(client), FreshClaimTimes: freshClaimTimes}
	}
}

// freshClaimTimes bounds how far behind the server's clock the times of a
// plain fresh claim may be: they are this host's clock at the send, and
// the suite's parallel cases on a loaded machine can hold a command that
// long before Redis runs it.
const freshClaimTimes = 250 * time.Millisecond

// putForeign writes the values that a bug or another program could leave
// under a key; storetest's keys are deleted when each case ends.
func putForeign(c redis.UniversalClient) func(key string, kind string) error {
	return func(key string, kind string) error {
		ctx := context.Background()
		switch kind {
		case "short-string":
			return c.Set(ctx, key, "1", 0).Err()
		case "long-string":
			return c.Set(ctx, key, strings.Repeat("not a record, ", 8)[:100], 0).Err()
		case "json":
			return c.Set(ctx, key, `{"state":"completed","attempts":1}`, 0).Err()
		case "wrong-type":
			return c.RPush(ctx, key, "a", "b").Err()
		case "bad-fields":
			// The IN_PROGRESS string's tag and state, then 36 zero bytes: no
			// attempt, no times.
			return c.Set(ctx, key, append([]byte{0xC0, 'P'}, make([]byte, 36)...), 0).Err()
		}
		return fmt.Errorf("putForeign: unknown kind %q", kind)
	}
}
