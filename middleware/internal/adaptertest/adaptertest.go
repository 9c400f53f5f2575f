package adaptertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// StoreKind builds a fresh store for one test, and a key prefix unique to
// it so that tests sharing the Redis server never see each other's keys.
type StoreKind struct {
	Name string
	New  func(t *testing.T) (store idempotency.Store, keyPrefix string)
}

// StoreKinds returns the stores every adapter test runs against: a
// memstore of the test's own with the adapter's defaultPrefix, and a
// redisstore on the test server with the prefix testPrefix, a hyphen and
// random hex (a prefix holds no colon), whose keys are deleted when the
// test ends.
func StoreKinds(defaultPrefix, testPrefix string) []StoreKind {
	return []StoreKind{
		{Name: "memstore", New: func(t *testing.T) (idempotency.Store, string) {
			s := memstore.New(nil)
			return s, defaultPrefix
		}},
		{Name: "redisstore", New: func(t *testing.T) (idempotency.Store, string) {
			client := testserver.RedisClient(t)
			s, err := redisstore.New(client, nil)
			require.NoError(t, err)
			prefix := testPrefix + "-" + RandomHex(t)
			t.Cleanup(func() {
				ctx := context.Background()
				iter := client.Scan(ctx, 0, prefix+":*", 100).Iterator()
				for iter.Next(ctx) {
					_ = client.Del(ctx, iter.Val()).Err()
				}
			})
			return s, prefix
		}},
	}
}

// RandomHex returns 16 random hex digits, for names that no other test
// uses.
func RandomHex(t testing.TB) string {
	var b [8]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return hex.EncodeToString(b[:])
}

// DownStore builds a store that cannot be reached.
type DownStore struct {
	Name string
	New  func(t *testing.T) idempotency.Store
}

// DownStores are the stores that cannot be reached: an in-process store
// whose every call fails, and a redisstore whose address nothing listens on.
var DownStores = []DownStore{
	{Name: "in-process down", New: func(*testing.T) idempotency.Store {
		return downStore{memstore.New(nil)}
	}},
	{Name: "redis not listening", New: func(t *testing.T) idempotency.Store {
		c := redis.NewClient(&redis.Options{
			ContextTimeoutEnabled: true,
			Addr:                  "127.0.0.1:" + strconv.Itoa(testserver.FreePort(t)),
			MaxRetries:            -1,
			DialTimeout:           200 * time.Millisecond,
		})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(c, nil)
		require.NoError(t, err)
		return s
	}},
}

// downStore is an in-process store (it embeds a memstore, which marks it
// so) whose every call fails with errDown.
type downStore struct{ *memstore.Store }

var errDown = errors.New("adaptertest: store down")

func (downStore) Claim(context.Context, string, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{}, errDown
}
func (downStore) Renew(context.Context, string, string, time.Duration) error { return errDown }
func (downStore) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errDown
}
func (downStore) Fail(context.Context, string, string, time.Duration) error { return errDown }
func (downStore) Release(context.Context, string, string) error             { return errDown }
func (downStore) Get(context.Context, string) (idempotency.Record, error) {
	return idempotency.Record{}, errDown
}
func (downStore) Delete(context.Context, string) error { return errDown }

// PartitionedStore returns a redisstore on the test server reached through
// a fault proxy that carries nothing: every call waits, unanswered, until
// its context ends, as a store slower than any deadline.
func PartitionedStore(t *testing.T) idempotency.Store {
	proxy := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, nil)
	require.NoError(t, err)
	proxy.Partition()
	t.Cleanup(proxy.Close) // before the client closes, which would wait on the partition
	return s
}

// RequireProblems checks that err holds every problem of an invalid
// Config: its message is want (one problem a line, in the order Validate
// checks them), each problem on its own matches invalid (the adapter's
// ErrInvalidConfig), and the first matches first as well, unless first is
// nil.
func RequireProblems(t testing.TB, err error, want string, invalid, first error) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, want, err.Error())
	joined, ok := err.(interface{ Unwrap() []error })
	require.True(t, ok, "errors.Join of the problems")
	for _, p := range joined.Unwrap() {
		require.ErrorIs(t, p, invalid, p.Error())
	}
	if first != nil {
		require.ErrorIs(t, joined.Unwrap()[0], first)
	}
}
