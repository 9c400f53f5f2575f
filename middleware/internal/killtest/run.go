package killtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Keys returns n message keys, order-00 and on.
func Keys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%02d", i)
	}
	return keys
}

// Schedule returns perWindow kills in each window, shuffled: the phase on
// whose announcement each consumer in turn is killed.
func Schedule(perWindow int) []string {
	var schedule []string
	for _, p := range phases {
		for range perWindow {
			schedule = append(schedule, p)
		}
	}
	rand.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	return schedule
}

// Setup is one store's run.
type Setup struct {
	// Kind names the store: the consumer's Kind and the report's first
	// column.
	Kind string
	// Store is the store, on the consumers' table, that the test reads the
	// keys' records with.
	Store idempotency.Store
	// Table is the store's table, handed to the consumers; empty for a
	// store without one.
	Table string
	// Effects is the effects table, handed to the consumers.
	Effects string
	// CountEffects returns the effects table's rows by key.
	CountEffects func(ctx context.Context) (map[string]int, error)
	// Redis is the broker's server, and that of a store on Redis.
	Redis *redis.Client
	// Keys are the messages' keys, one message each.
	Keys []string
}

// Run is one store's run of a kill schedule.
type Run struct {
	t        *testing.T
	s        Setup
	env      string // consumerVar=JSON of the Consumer
	prefix   string
	topic    string
	group    string
	broker   string
	children int
	// Landed counts the kills by the window they landed in.
	Landed map[string]int
}

// Counts is what a run left in the effects table.
type Counts struct {
	Keys, Effects, Doubles, Lost int
	// PerKey is the effects of each key.
	PerKey map[string]int
}

// New prepares a run on its own stream, group and key prefix, all removed
// when the test ends; the tables are the Setup's.
func New(t *testing.T, s Setup) *Run {
	t.Helper()
	names := s.Kind + "-kill-"
	k := &Run{
		t: t, s: s,
		prefix: testserver.UniqueName(names),
		topic:  testserver.UniqueName(names),
		group:  testserver.UniqueName(names),
		broker: "redis://" + s.Redis.Options().Addr + "/0",
	}
	env, err := json.Marshal(&Consumer{
		Kind: s.Kind, Table: s.Table, Effects: s.Effects, Redis: s.Redis.Options().Addr,
		Broker: k.broker, Topic: k.topic, Group: k.group, Prefix: k.prefix,
	})
	require.NoError(t, err)
	k.env = consumerVar + "=" + string(env)
	rc := s.Redis
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
	return k
}

// consumer is one child process and the phase lines it printed.
type consumer struct {
	cmd   *exec.Cmd
	lines chan [2]string // phase, key
	read  chan struct{}  // closed when stdout reached EOF
	log   string
}

func (k *Run) start() *consumer {
	k.t.Helper()
	self, err := os.Executable()
	require.NoError(k.t, err)
	k.children++
	logPath := filepath.Join(k.t.TempDir(), fmt.Sprintf("child-%d.log", k.children))
	logFile, err := os.Create(logPath)
	require.NoError(k.t, err)
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), k.env)
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	require.NoError(k.t, err)
	if err := cmd.Start(); err != nil {
		k.t.Fatalf("%s: cannot start the consumer process %s: %v", k.s.Kind, self, err)
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
func (k *Run) killOn(c *consumer, phase string) string {
	k.t.Helper()
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.exited(k.t, k.s.Kind, "before it was killed")
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
			k.t.Fatalf("%s: the consumer announced no %q within 20 s; its log:\n%s", k.s.Kind, phase, log)
		}
	}
}

// storedKey is the middleware's key of a message key: prefix:scope:key.
func (k *Run) storedKey(key string) string {
	return k.prefix + ":" + handlerName + ":" + key
}

// drained reports whether every key is COMPLETED and the group has acked
// every message of the stream.
func (k *Run) drained(ctx context.Context) (bool, string) {
	keys := k.s.Keys
	completed := 0
	for _, key := range keys {
		rec, err := k.s.Store.Get(ctx, k.storedKey(key))
		if err == nil && rec.State == idempotency.StateCompleted {
			completed++
		}
	}
	groups, err := k.s.Redis.XInfoGroups(ctx, k.topic).Result()
	if err != nil || len(groups) != 1 {
		return false, fmt.Sprintf("%d of %d keys completed; consumer group: %v", completed, len(keys), err)
	}
	stream, err := k.s.Redis.XInfoStream(ctx, k.topic).Result()
	if err != nil {
		return false, fmt.Sprintf("%d of %d keys completed; stream: %v", completed, len(keys), err)
	}
	g := groups[0]
	status := fmt.Sprintf("%d of %d keys completed; %d messages pending, last delivered %s of %s",
		completed, len(keys), g.Pending, g.LastDeliveredID, stream.LastGeneratedID)
	return completed == len(keys) && g.Pending == 0 && g.LastDeliveredID == stream.LastGeneratedID, status
}

func (k *Run) count(ctx context.Context) Counts {
	perKey, err := k.s.CountEffects(ctx)
	require.NoError(k.t, err)
	c := Counts{Keys: len(k.s.Keys), PerKey: perKey}
	for _, key := range k.s.Keys {
		n := c.PerKey[key]
		c.Effects += n
		if n == 0 {
			c.Lost++
		}
		if n > 1 {
			c.Doubles += n - 1
		}
	}
	return c
}

// Kill publishes the keys, kills a consumer once per entry of schedule
// (on the next announcement of that phase, restarting it every time), lets
// a last consumer finish, and returns what the effects table holds.
func (k *Run) Kill(schedule []string) Counts {
	k.t.Helper()
	ctx := context.Background()
	b, err := backends.New(brokerConfig(k.broker, k.group), watermill.NopLogger{})
	require.NoError(k.t, err)
	for _, key := range k.s.Keys {
		m := message.NewMessage(watermill.NewUUID(), []byte("book"))
		m.Metadata.Set("requestId", key)
		require.NoError(k.t, b.Publisher.Publish(k.topic, m))
	}
	require.NoError(k.t, b.Close())

	k.Landed = map[string]int{}
	for _, phase := range schedule {
		k.Landed[k.killOn(k.start(), phase)]++
	}

	last := k.start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		done, status := k.drained(ctx)
		if done {
			break
		}
		if !last.alive() {
			last.exited(k.t, k.s.Kind, "before it finished: "+status)
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("%s: the last consumer did not finish within 30 s: %s", k.s.Kind, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	last.stop()
	return k.count(ctx)
}

// Report is the run's count line: the kills by window, then the keys,
// effects, doubles and lost keys.
func (k *Run) Report(c Counts) string {
	var windows []string
	total := 0
	for _, p := range phases {
		windows = append(windows, fmt.Sprintf("%d %s", k.Landed[p], phaseNames[p]))
		total += k.Landed[p]
	}
	return fmt.Sprintf("%-10s kills %d (%s): %d keys, %d effects, %d doubles, %d lost",
		k.s.Kind, total, strings.Join(windows, ", "), c.Keys, c.Effects, c.Doubles, c.Lost)
}

// AssertExactlyOnce checks a run whose effect commits with COMPLETED in the
// store's transaction: a kill landed in every window, and every key has
// exactly one effect and is COMPLETED.
func (k *Run) AssertExactlyOnce(c Counts) {
	t := k.t
	t.Helper()
	for _, p := range phases {
		assert.Positive(t, k.Landed[p], "no kill landed %s: the schedule did not test that window", phaseNames[p])
	}
	assert.Zero(t, c.Doubles, "doubled effects")
	assert.Zero(t, c.Lost, "keys without an effect")
	for _, key := range k.s.Keys {
		assert.Equal(t, 1, c.PerKey[key], "effects of key %s", key)
		rec, err := k.s.Store.Get(context.Background(), k.storedKey(key))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State, "key %s", key)
	}
}

// AssertNoneLost checks a run whose effect commits on its own, before the
// middleware writes COMPLETED: every key has an effect and is COMPLETED.
// Doubles are the contrast, not a defect of such a store: a run may by
// chance have none, so only losses fail.
func (k *Run) AssertNoneLost(c Counts) {
	t := k.t
	t.Helper()
	assert.Zero(t, c.Lost, "keys without an effect")
	for _, key := range k.s.Keys {
		rec, err := k.s.Store.Get(context.Background(), k.storedKey(key))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State, "key %s", key)
	}
}
