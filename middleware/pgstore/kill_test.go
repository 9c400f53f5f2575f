package pgstore_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	_ "github.com/idempotency/watermill-idempotency/backends/redisbackend" // the consumers read Redis Streams
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// The kill test's consumer is this test binary, re-executed with these
// variables set; TestMain runs killChild instead of the tests.
const (
	killStoreVar   = "PGSTORE_KILL_CHILD" // "pgstore" or "redisstore"
	killBrokerVar  = "PGSTORE_KILL_BROKER"
	killTopicVar   = "PGSTORE_KILL_TOPIC"
	killGroupVar   = "PGSTORE_KILL_GROUP"
	killTableVar   = "PGSTORE_KILL_TABLE" // pgstore's table
	killRedisVar   = "PGSTORE_KILL_REDIS" // redisstore's server
	killPrefixVar  = "PGSTORE_KILL_PREFIX"
	killEffectsVar = "PGSTORE_KILL_EFFECTS"
)

// Timers of the kill test, in production's order (NackDelay < NackResendSleep
// < lease < MaxIdleTime) but scaled down so that a dead consumer's key and
// message are taken over within a second.
const (
	killLease      = 400 * time.Millisecond
	killNackDelay  = 50 * time.Millisecond
	killNackResend = 100 * time.Millisecond
	killIdle       = 500 * time.Millisecond // Redis Streams MaxIdleTime
	killClaimEvery = 200 * time.Millisecond // Redis Streams ClaimInterval
	// killWindow is how long the consumer stays in each window, so that a
	// SIGKILL sent when it announces the window lands inside it.
	killWindow = 20 * time.Millisecond
	// killHandler is the router handler's name, the scope of the keys.
	killHandler = "kill"
)

// The windows a consumer is killed in, announced on its stdout as
// "<phase> <key>" when it enters them.
const (
	phaseStart     = "start"     // claimed, effect not made
	phaseEffect    = "effect"    // effect made, not committed
	phaseCommitted = "committed" // effect and COMPLETED committed, message not acked
)

var phaseNames = map[string]string{
	phaseStart:     "before effect",
	phaseEffect:    "between effect and commit",
	phaseCommitted: "after commit",
}

// killChild consumes the topic under the idempotency middleware on the store
// named by kind, making one row in the effects table per run of the handler,
// and announces each window on stdout, until it is killed. With pgstore the
// row and COMPLETED commit in one transaction; with redisstore the row
// commits on its own and the middleware writes COMPLETED to Redis after the
// handler returned, as it does for any effect outside the store.
func killChild(kind string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "kill child:", err)
		return 2
	}
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testserver.PostgresURL())
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	insert := "INSERT INTO " + pgx.Identifier{os.Getenv(killEffectsVar)}.Sanitize() + " (key) VALUES ($1)"

	var stdout sync.Mutex
	say := func(phase, key string) {
		stdout.Lock()
		defer stdout.Unlock()
		fmt.Fprintln(os.Stdout, phase, key) // unbuffered: one write per line
	}
	// ran marks, in the context the outer middleware gives each message,
	// that the handler ran for it: a duplicate's ack is no "committed".
	type ranKey struct{}
	markRan := func(msg *message.Message) {
		if p, ok := msg.Context().Value(ranKey{}).(*bool); ok {
			*p = true
		}
	}

	var (
		store   idempotency.Store
		handler message.NoPublishHandlerFunc
	)
	switch kind {
	case "pgstore":
		pg, err := pgstore.New(pool, pgstore.Config{Table: os.Getenv(killTableVar)})
		if err != nil {
			return fail(err)
		}
		store = pg
		handler = func(msg *message.Message) error {
			markRan(msg)
			key, ctx := msg.Metadata.Get("requestId"), msg.Context()
			say(phaseStart, key)
			time.Sleep(killWindow)
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, insert, key); err != nil {
					return err
				}
				say(phaseEffect, key)
				// Half of the window before the completion, half after it,
				// while the completion holds the key's row locked.
				time.Sleep(killWindow / 2)
				if err := pg.CompleteInTx(ctx, tx); err != nil {
					return err
				}
				time.Sleep(killWindow / 2)
				return nil
			})
		}
	case "redisstore":
		store, err = redisstore.New(redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: os.Getenv(killRedisVar)}))
		if err != nil {
			return fail(err)
		}
		handler = func(msg *message.Message) error {
			markRan(msg)
			key, ctx := msg.Metadata.Get("requestId"), msg.Context()
			say(phaseStart, key)
			time.Sleep(killWindow)
			if _, err := pool.Exec(ctx, insert, key); err != nil { // commits on its own
				return err
			}
			say(phaseEffect, key)
			time.Sleep(killWindow)
			return nil // the middleware writes COMPLETED next
		}
	default:
		return fail(fmt.Errorf("unknown store %q", kind))
	}

	idem, err := idempotency.New(idempotency.Config{
		Store: store, KeyPrefix: os.Getenv(killPrefixVar), LeaseTTL: killLease,
		NackDelay: killNackDelay, StoreTimeout: time.Second,
	}, logger)
	if err != nil {
		return fail(err)
	}
	b, err := backends.New(killBrokerConfig(os.Getenv(killBrokerVar), os.Getenv(killGroupVar)), logger)
	if err != nil {
		return fail(err)
	}
	r, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return fail(err)
	}
	// Outside the idempotency middleware: it sees the message after
	// COMPLETED was committed and before the router acks it.
	announceCommitted := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ran := new(bool)
			msg.SetContext(context.WithValue(msg.Context(), ranKey{}, ran))
			out, err := h(msg)
			if err == nil && *ran {
				say(phaseCommitted, msg.Metadata.Get("requestId"))
				time.Sleep(killWindow)
			}
			return out, err
		}
	}
	r.AddMiddleware(announceCommitted, idem.Middleware)
	r.AddConsumerHandler(killHandler, os.Getenv(killTopicVar), b.Subscriber, handler)
	if err := r.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// killBrokerConfig is the Redis Streams configuration of the consumers and
// of the publisher. Every consumer has the same name, as a restarted pod
// has: the messages its predecessor held stay pending under that name and
// are claimed again (by itself) once idle for killIdle.
func killBrokerConfig(url, group string) backends.Config {
	return backends.Config{
		URL:             url,
		Group:           group,
		Consumer:        "kill-consumer",
		NackResendSleep: killNackResend,
		Redis:           backends.RedisConfig{MaxIdleTime: killIdle, ClaimInterval: killClaimEvery},
	}
}

// killRun is one store's run of the kill schedule.
type killRun struct {
	t        *testing.T
	kind     string
	env      []string
	pool     *pgxpool.Pool
	store    idempotency.Store
	effects  string
	prefix   string
	keys     []string
	redis    *redis.Client
	broker   string
	topic    string
	group    string
	landed   map[string]int // kills by the window they landed in
	children int
}

// consumer is one child process and the phase lines it printed.
type consumer struct {
	cmd   *exec.Cmd
	lines chan [2]string // phase, key
	read  chan struct{}  // closed when stdout reached EOF
	log   string
}

func (k *killRun) start() *consumer {
	k.t.Helper()
	self, err := os.Executable()
	require.NoError(k.t, err)
	k.children++
	logPath := filepath.Join(k.t.TempDir(), fmt.Sprintf("child-%d.log", k.children))
	logFile, err := os.Create(logPath)
	require.NoError(k.t, err)
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), k.env...)
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	require.NoError(k.t, err)
	if err := cmd.Start(); err != nil {
		k.t.Fatalf("%s: cannot start the consumer process %s: %v", k.kind, self, err)
	}
	c := &consumer{cmd: cmd, lines: make(chan [2]string, 64), read: make(chan struct{}), log: logPath}
	k.t.Cleanup(func() { c.stop() })
	go func() {
		defer close(c.read)
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if phase, key, ok := strings.Cut(sc.Text(), " "); ok && phaseNames[phase] != "" {
				c.lines <- [2]string{phase, key}
			}
		}
	}()
	return c
}

// stop kills the process if it still runs and reaps it; Wait closes the
// stdout pipe, so it comes after the reader saw EOF.
func (c *consumer) stop() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Kill()
	for range c.lines { // drain, so the reader reaches EOF
	}
	<-c.read
	_ = c.cmd.Wait()
}

// alive discards what the consumer announced so far, so that its stdout
// never fills, and reports whether it still runs.
func (c *consumer) alive() bool {
	for {
		select {
		case _, ok := <-c.lines:
			if !ok {
				return false
			}
		default:
			return true
		}
	}
}

// exited fails the test with the log of a consumer that died on its own.
func (c *consumer) exited(t *testing.T, kind, what string) {
	t.Helper()
	<-c.read
	err := c.cmd.Wait()
	log, _ := os.ReadFile(c.log)
	t.Fatalf("%s: the consumer process exited (%v) %s; its log:\n%s", kind, err, what, log)
}

// killOn waits for the consumer to announce phase, SIGKILLs it, and returns
// the last phase it announced before it died: the window the kill landed in
// (later than phase if the consumer moved on before the signal arrived).
func (k *killRun) killOn(c *consumer, phase string) string {
	k.t.Helper()
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.exited(k.t, k.kind, "before it was killed")
			}
			if l[0] != phase {
				continue
			}
			require.NoError(k.t, c.cmd.Process.Kill())
			last := l
			for l := range c.lines { // what it printed before the signal landed
				last = l
			}
			<-c.read
			_ = c.cmd.Wait()
			return last[0]
		case <-timeout.C:
			log, _ := os.ReadFile(c.log)
			k.t.Fatalf("%s: the consumer announced no %q within 20 s; its log:\n%s", k.kind, phase, log)
		}
	}
}

// storedKey is the middleware's key of a message key: prefix:scope:key.
func (k *killRun) storedKey(key string) string {
	return k.prefix + ":" + killHandler + ":" + key
}

// drained reports whether every key is COMPLETED and the group has acked
// every message of the stream.
func (k *killRun) drained(ctx context.Context) (bool, string) {
	completed := 0
	for _, key := range k.keys {
		rec, err := k.store.Get(ctx, k.storedKey(key))
		if err == nil && rec.State == idempotency.StateCompleted {
			completed++
		}
	}
	groups, err := k.redis.XInfoGroups(ctx, k.topic).Result()
	if err != nil || len(groups) != 1 {
		return false, fmt.Sprintf("%d of %d keys completed; consumer group: %v", completed, len(k.keys), err)
	}
	stream, err := k.redis.XInfoStream(ctx, k.topic).Result()
	if err != nil {
		return false, fmt.Sprintf("%d of %d keys completed; stream: %v", completed, len(k.keys), err)
	}
	g := groups[0]
	status := fmt.Sprintf("%d of %d keys completed; %d messages pending, last delivered %s of %s",
		completed, len(k.keys), g.Pending, g.LastDeliveredID, stream.LastGeneratedID)
	return completed == len(k.keys) && g.Pending == 0 && g.LastDeliveredID == stream.LastGeneratedID, status
}

// killCounts is what a run left in the effects table.
type killCounts struct {
	keys, effects, doubles, lost int
	perKey                       map[string]int
}

func (k *killRun) count(ctx context.Context) killCounts {
	c := killCounts{keys: len(k.keys), perKey: map[string]int{}}
	rows, err := k.pool.Query(ctx, "SELECT key, count(*) FROM "+quoted(k.effects)+" GROUP BY key")
	require.NoError(k.t, err)
	var (
		key string
		n   int
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		c.perKey[key] = n
		return nil
	})
	require.NoError(k.t, err)
	for _, key := range k.keys {
		n := c.perKey[key]
		c.effects += n
		if n == 0 {
			c.lost++
		}
		if n > 1 {
			c.doubles += n - 1
		}
	}
	return c
}

// runKills publishes the keys, kills a consumer once per entry of schedule
// (on the next announcement of that phase, restarting it every time), lets
// a last consumer finish, and returns what the effects table holds.
func (k *killRun) runKills(schedule []string) killCounts {
	ctx := context.Background()
	b, err := backends.New(killBrokerConfig(k.broker, k.group), watermill.NopLogger{})
	require.NoError(k.t, err)
	for _, key := range k.keys {
		m := message.NewMessage(watermill.NewUUID(), []byte("book"))
		m.Metadata.Set("requestId", key)
		require.NoError(k.t, b.Publisher.Publish(k.topic, m))
	}
	require.NoError(k.t, b.Close())

	k.landed = map[string]int{}
	for _, phase := range schedule {
		k.landed[k.killOn(k.start(), phase)]++
	}

	last := k.start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		done, status := k.drained(ctx)
		if done {
			break
		}
		if !last.alive() {
			last.exited(k.t, k.kind, "before it finished: "+status)
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("%s: the last consumer did not finish within 30 s: %s", k.kind, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	last.stop()
	return k.count(ctx)
}

func (k *killRun) report(c killCounts) string {
	var windows []string
	total := 0
	for _, p := range []string{phaseStart, phaseEffect, phaseCommitted} {
		windows = append(windows, fmt.Sprintf("%d %s", k.landed[p], phaseNames[p]))
		total += k.landed[p]
	}
	return fmt.Sprintf("%-10s kills %d (%s): %d keys, %d effects, %d doubles, %d lost",
		k.kind, total, strings.Join(windows, ", "), c.keys, c.effects, c.doubles, c.lost)
}

// newKillRun prepares a run on its own tables, stream, group and key prefix,
// all removed when the test ends.
func newKillRun(t *testing.T, kind string, pool *pgxpool.Pool, rc *redis.Client, keys []string) *killRun {
	t.Helper()
	k := &killRun{
		t: t, kind: kind, pool: pool, redis: rc, keys: keys,
		effects: effectsTable(t, pool),
		prefix:  testserver.UniqueName("pgstore-kill-"),
		topic:   testserver.UniqueName("pgstore-kill-"),
		group:   testserver.UniqueName("pgstore-kill-"),
		broker:  "redis://" + rc.Options().Addr + "/0",
	}
	k.env = []string{
		killStoreVar + "=" + kind,
		killBrokerVar + "=" + k.broker,
		killTopicVar + "=" + k.topic,
		killGroupVar + "=" + k.group,
		killRedisVar + "=" + rc.Options().Addr,
		killPrefixVar + "=" + k.prefix,
		killEffectsVar + "=" + k.effects,
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := rc.Del(ctx, k.topic).Err(); err != nil {
			t.Logf("cleanup: stream %s: %v", k.topic, err)
		}
		iter := rc.Scan(ctx, 0, k.prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			_ = rc.Del(ctx, iter.Val()).Err()
		}
		if err := iter.Err(); err != nil {
			t.Logf("cleanup: keys %s:*: %v", k.prefix, err)
		}
	})
	switch kind {
	case "pgstore":
		store, table := newTable(t, pool)
		k.store = store
		k.env = append(k.env, killTableVar+"="+table)
	case "redisstore":
		store, err := redisstore.New(rc)
		require.NoError(t, err)
		k.store = store
	}
	return k
}

// A consumer process is SIGKILLed 30 times, in the three windows of a
// message's handling, and restarted each time; the same schedule runs with
// pgstore, whose handler commits its effect and COMPLETED in one
// transaction, and with redisstore, whose effect commits on its own before
// the middleware writes COMPLETED. pgstore must leave exactly one effect per
// key; redisstore loses no key but may double those killed between the
// effect and the completion, which the test reports.
func TestKillConsumerProcess(t *testing.T) {
	pool := testPool(t)
	rc := testserver.RedisClient(t)
	const nKeys, perWindow = 60, 10
	keys := make([]string, nKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%02d", i)
	}
	var schedule []string
	for _, p := range []string{phaseStart, phaseEffect, phaseCommitted} {
		for range perWindow {
			schedule = append(schedule, p)
		}
	}
	rand.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })

	t.Run("pgstore", func(t *testing.T) {
		k := newKillRun(t, "pgstore", pool, rc, keys)
		c := k.runKills(schedule)
		t.Log(k.report(c))
		for _, p := range []string{phaseStart, phaseEffect, phaseCommitted} {
			assert.Positive(t, k.landed[p], "no kill landed %s: the schedule did not test that window", phaseNames[p])
		}
		assert.Zero(t, c.doubles, "doubled effects")
		assert.Zero(t, c.lost, "keys without an effect")
		for _, key := range keys {
			assert.Equal(t, 1, c.perKey[key], "effects of key %s", key)
			rec, err := k.store.Get(context.Background(), k.storedKey(key))
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateCompleted, rec.State, "key %s", key)
		}
	})
	t.Run("redisstore", func(t *testing.T) {
		k := newKillRun(t, "redisstore", pool, rc, keys)
		c := k.runKills(schedule)
		t.Log(k.report(c))
		// Doubles are the contrast, not a defect of redisstore: a run may
		// by chance have none, so only losses fail.
		assert.Zero(t, c.lost, "keys without an effect")
		for _, key := range keys {
			rec, err := k.store.Get(context.Background(), k.storedKey(key))
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateCompleted, rec.State, "key %s", key)
		}
	})
}
