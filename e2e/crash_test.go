package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// The crash child is this test binary, re-executed with these variables set
// (beside the BROKER_* ones that backends.FromEnv reads); TestMain runs
// crashChild instead of the tests.
const (
	childEnvVar     = "E2E_CRASH_CHILD" // the topic to consume
	childStoreVar   = "E2E_STORE_ADDR"
	childLedgerVar  = "E2E_LEDGER_ADDR"
	childPrefixVar  = "E2E_KEY_PREFIX"
	childStartedVar = "E2E_STARTED_HASH"
	// childPGTableVar, when set, makes the child keep its records in this
	// pgstore table on the shared PostgreSQL (PG_URL) instead of in the
	// Redis at E2E_STORE_ADDR: a pg- column.
	childPGTableVar = "E2E_PG_TABLE"
)

// childStore is the store of a child process: a pgstore on the table that
// E2E_PG_TABLE names, or a redisstore on E2E_STORE_ADDR.
func childStore() (idempotency.Store, error) {
	if table := os.Getenv(childPGTableVar); table != "" {
		pool, err := pgxpool.New(context.Background(), testserver.PostgresURL())
		if err != nil {
			return nil, err
		}
		return pgstore.New(pool, pgstore.Config{Table: table})
	}
	return redisstore.New(redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: os.Getenv(childStoreVar)}))
}

// childStoreEnv is what a child needs to reach e's store.
func (e *env) childStoreEnv() []string {
	return []string{childStoreVar + "=" + e.storeURL, childPGTableVar + "=" + e.pgTable}
}

// crashChild is a consumer that claims keys and then hangs in its handler
// until it is killed. Before hanging, it writes each key and the time its
// handler started (after the claim) to the ledger hash E2E_STARTED_HASH.
func crashChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	cfg, err := backends.FromEnv()
	if err != nil {
		return fail(err)
	}
	cfg.Kafka.Tune = kafkaTune
	b, err := backends.New(cfg, logger())
	if err != nil {
		return fail(err)
	}
	store, err := childStore()
	if err != nil {
		return fail(err)
	}
	idem, err := idempotency.New(idempotency.Config{
		Store: store, KeyPrefix: os.Getenv(childPrefixVar), LeaseTTL: lease, NackDelay: nackDelay,
		StoreTimeout: time.Second, CompletedTTL: time.Hour, FailedTTL: time.Hour,
	}, logger())
	if err != nil {
		return fail(err)
	}
	ledger := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: os.Getenv(childLedgerVar)})
	started := os.Getenv(childStartedVar)

	r, err := message.NewRouter(message.RouterConfig{}, logger())
	if err != nil {
		return fail(err)
	}
	r.AddMiddleware(idem.Middleware)
	r.AddConsumerHandler(handlerName, os.Getenv(childEnvVar), b.Subscriber, func(msg *message.Message) error {
		key := msg.Metadata.Get("requestId")
		now := strconv.FormatInt(time.Now().UnixMilli(), 10)
		if err := ledger.HSet(context.Background(), started, key, now).Err(); err != nil {
			fmt.Fprintln(os.Stderr, "crash child: ledger:", err)
		}
		time.Sleep(time.Hour) // in the middle of the handler until SIGKILL
		return nil
	})
	if err := r.Run(context.Background()); err != nil {
		return fail(err)
	}
	return 0
}

// crash: a consumer in a child process claims keys and is killed with
// SIGKILL in the middle of its handlers. Two survivors (started after the
// kill) get the messages again from the broker: Kafka after the dead
// member's session times out, Redis Streams by XCLAIM after MaxIdleTime,
// RabbitMQ at once (the connection dropped), NATS after AckWait. They must
// not run a key before the dead consumer's lease expired, and must then run
// it, once.
func crash(e *env) {
	const n, survivors = 20, 2
	keys := keyNames("x", n)
	e.expectEffects("up", keys)
	startedHash := e.ledgerKey("started")

	self, err := os.Executable()
	require.NoError(e.t, err)
	logPath := filepath.Join(e.t.TempDir(), "child.log")
	logFile, err := os.Create(logPath)
	require.NoError(e.t, err)
	defer logFile.Close()
	child := exec.Command(self, "-test.run=^$")
	child.Env = append(os.Environ(), childEnv(e.b.config(e.url, e.group, e.id+"-crashed"))...)
	child.Env = append(child.Env,
		childEnvVar+"="+e.topic,
		childLedgerVar+"="+e.ledger.Options().Addr,
		childPrefixVar+"="+e.prefix,
		childStartedVar+"="+startedHash,
	)
	child.Env = append(child.Env, e.childStoreEnv()...)
	child.Stdout, child.Stderr = logFile, logFile
	require.NoError(e.t, child.Start())
	killed := false
	defer func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	}()

	var msgs []*message.Message
	for _, k := range keys {
		msgs = append(msgs, newMsg(k, 0, watermill.NewUUID()))
	}
	e.publish(msgs...)
	e.waitFor("the child's handlers started", func() bool {
		n, _ := e.ledger.HLen(context.Background(), startedHash).Result()
		if n == 0 && child.ProcessState != nil {
			log, _ := os.ReadFile(logPath)
			e.t.Fatalf("crash child exited: %s", log)
		}
		return n > 0
	})
	time.Sleep(500 * time.Millisecond) // let it take whatever else it will
	require.NoError(e.t, child.Process.Signal(syscall.SIGKILL))
	_ = child.Wait()
	killed = true
	startedAt, err := e.ledger.HGetAll(context.Background(), startedHash).Result()
	require.NoError(e.t, err)

	var effectAt sync.Map // key -> time.Time its survivor's handler ran
	e.handle(survivors, func(msg *message.Message) error {
		e.runs.Add(1)
		key := msg.Metadata.Get("requestId")
		effectAt.Store(key, time.Now())
		return e.effect(msg, "up", key)
	})
	e.note = func() string { return fmt.Sprintf("child killed in the handlers of %d keys", len(startedAt)) }
	e.finish()

	require.NotEmpty(e.t, startedAt, "the child was killed in the middle of a handler")
	for key, ms := range startedAt {
		at, err := strconv.ParseInt(ms, 10, 64)
		require.NoError(e.t, err)
		v, ok := effectAt.Load(key)
		if !assert.True(e.t, ok, "key %s, orphaned by the child, was taken over", key) {
			continue
		}
		took := v.(time.Time)
		// The child claimed before its handler started, so its lease ran out
		// at most lease after `at`; 50 ms allow for the clocks of two
		// processes read at different moments of one host.
		waited := took.Sub(time.UnixMilli(at))
		assert.GreaterOrEqual(e.t, waited, lease-50*time.Millisecond,
			"key %s was taken over %v after the dead consumer started it: before its %v lease expired", key, waited, lease)
	}
}
