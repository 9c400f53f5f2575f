package idempotency_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// sharedRedisStore returns a store on the shared Redis and a key prefix
// unique to the test.
func sharedRedisStore(t *testing.T) (idempotency.Store, string) {
	t.Helper()
	s, err := redisstore.New(testserver.RedisClient(t), nil)
	require.NoError(t, err)
	return s, "test-" + watermill.NewShortUUID()
}

// ledger records each key's side effect, separately from the store.
type ledger struct {
	mu      sync.Mutex
	effects map[string]int
}

func newLedger() *ledger { return &ledger{effects: map[string]int{}} }

func (l *ledger) record(key string) {
	l.mu.Lock()
	l.effects[key]++
	l.mu.Unlock()
}

func (l *ledger) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.effects[key]
}

// exactlyOnce checks that each of n keys key-0..key-(n-1) had one effect.
func (l *ledger) exactlyOnce(t *testing.T, n int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Len(t, l.effects, n, "every key had its effect, and no other key did")
	for i := range n {
		if c := l.effects[fmt.Sprintf("key-%d", i)]; c != 1 {
			t.Errorf("key-%d had its effect %d times", i, c)
		}
	}
}

func TestRedisThousandMessagesThreeCopiesFlakyFirstAttempts(t *testing.T) {
	store, prefix := sharedRedisStore(t)
	idem, obs := newIdem(t, testConfig{Store: store, KeyPrefix: prefix})
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })

	const unique, copies = 1000, 3
	effects := newLedger()
	var attempted sync.Map
	var injected atomic.Int32
	count := &acks{}
	startRouter(t, func(r *message.Router) {
		r.AddMiddleware(count.middleware, idem.Middleware)
		r.AddConsumerHandler("flaky", "in", pubSub, func(msg *message.Message) error {
			key := msg.Metadata.Get("requestId")
			if _, seen := attempted.LoadOrStore(key, true); !seen && fnvMod(key, 5) == 0 {
				injected.Add(1)
				return errHandler // a fifth of the first attempts fail
			}
			effects.record(key)
			return nil
		})
	})
	for i := range unique {
		for range copies {
			require.NoError(t, pubSub.Publish("in", newMsg(fmt.Sprintf("key-%d", i), "p")))
		}
	}
	require.Eventually(t, func() bool { return count.acked.Load() == unique*copies }, 60*time.Second, 10*time.Millisecond,
		"every delivery ends acked")
	effects.exactlyOnce(t, unique)
	assert.Greater(t, injected.Load(), int32(unique/10), "the run had failures to recover from")
	assert.Equal(t, int(injected.Load()), obs.get(idempotency.OutcomeHandlerFailed))
	assert.EqualValues(t, int(injected.Load())+obs.get(idempotency.OutcomeInProgress), count.nacked.Load(),
		"only failed attempts, and copies that met a running first attempt, were nacked")
	assert.Equal(t, unique, obs.get(idempotency.OutcomeProcessed))
	assert.Equal(t, unique*(copies-1), obs.get(idempotency.OutcomeDuplicate))
	t.Logf("deliveries acked %d, nacked %d, effects %d", count.acked.Load(), count.nacked.Load(), len(effects.effects))
}

func fnvMod(s string, n uint32) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32() % n
}

// twoRouters starts two routers, each with its own gochannel, one handler
// named "h" and the idempotency middleware on a shared store.
func twoRouters(t *testing.T, idem *idempotency.Middleware, count *acks, handler message.NoPublishHandlerFunc) []message.Publisher {
	var pubs []message.Publisher
	for range 2 {
		pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		t.Cleanup(func() { _ = pubSub.Close() })
		startRouter(t, func(r *message.Router) {
			r.AddMiddleware(count.middleware, idem.Middleware)
			r.AddConsumerHandler("h", "in", pubSub, handler)
		})
		pubs = append(pubs, pubSub)
	}
	return pubs
}

func TestRedisTwoRoutersSameMessageSameMoment(t *testing.T) {
	store, prefix := sharedRedisStore(t)
	idem, obs := newIdem(t, testConfig{Store: store, KeyPrefix: prefix, NackDelay: 20 * time.Millisecond})
	var runs atomic.Int32
	count := &acks{}
	pubs := twoRouters(t, idem, count, func(msg *message.Message) error {
		runs.Add(1)
		time.Sleep(200 * time.Millisecond)
		return nil
	})
	msg := newMsg("same", "p")
	var wg sync.WaitGroup
	for _, p := range pubs {
		wg.Add(1)
		go func() { defer wg.Done(); assert.NoError(t, p.Publish("in", msg.Copy())) }()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return count.acked.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
	assert.EqualValues(t, 1, runs.Load(), "the handler runs once")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeDuplicate), "the other copy is acked as a duplicate")
	assert.GreaterOrEqual(t, obs.get(idempotency.OutcomeInProgress), 1, "after being nacked while the first ran")
	assert.EqualValues(t, obs.get(idempotency.OutcomeInProgress), count.nacked.Load())
}

func TestRedisSlowHandlerIsNeverRunTwice(t *testing.T) {
	store, prefix := sharedRedisStore(t)
	const lease = 300 * time.Millisecond
	idem, obs := newIdem(t, testConfig{Store: store, KeyPrefix: prefix, LeaseTTL: lease, NackDelay: 20 * time.Millisecond})
	var runs atomic.Int32
	count := &acks{}
	pubs := twoRouters(t, idem, count, func(msg *message.Message) error {
		runs.Add(1)
		select {
		case <-time.After(3 * lease):
			return nil
		case <-msg.Context().Done():
			return context.Cause(msg.Context())
		}
	})
	msg := newMsg("slow", "p")
	require.NoError(t, pubs[0].Publish("in", msg.Copy()))
	require.Eventually(t, func() bool { return runs.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, pubs[1].Publish("in", msg.Copy())) // redelivered while the first runs
	require.Eventually(t, func() bool { return count.acked.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
	assert.EqualValues(t, 1, runs.Load(), "a handler running 3× its lease is never run a second time")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed), "and completes under its renewed lease")
	assert.GreaterOrEqual(t, obs.get(idempotency.OutcomeInProgress), 5, "the copy kept coming back meanwhile")
	assert.GreaterOrEqual(t, obs.op("renew"), 6)
}

func TestRedisDeadConsumerIsTakenOverAfterLease(t *testing.T) {
	store, prefix := sharedRedisStore(t)
	const lease = 400 * time.Millisecond
	idem, obs := newIdem(t, testConfig{Store: store, KeyPrefix: prefix, LeaseTTL: lease, NackDelay: 20 * time.Millisecond})
	var runs atomic.Int32
	count := &acks{}
	pubs := twoRouters(t, idem, count, func(msg *message.Message) error { runs.Add(1); return nil })

	// A consumer claimed the key, then died: its lease is never renewed.
	key := prefix + ":h:orphan" // prefix:scope:key, the scope being the handler's name
	deadReq := claimFor(lease, nil)
	dead, err := store.Claim(context.Background(), key, deadReq)
	require.NoError(t, err)
	require.True(t, dead.Acquired)
	claimed := time.Now()

	require.NoError(t, pubs[0].Publish("in", newMsg("orphan", "p")))
	require.Eventually(t, func() bool { return count.acked.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(claimed), lease, "taken over only once the lease expired")
	assert.EqualValues(t, 1, runs.Load())
	assert.GreaterOrEqual(t, obs.get(idempotency.OutcomeInProgress), 1, "nacked while the dead consumer's lease lived")
	assert.ErrorIs(t, store.Complete(context.Background(), key, deadReq.Token, nil, time.Minute), idempotency.ErrLeaseLost,
		"the dead consumer, had it woken up, is fenced")
}

func TestRedisKilledMidStreamAndRestarted(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(client, nil)
	require.NoError(t, err)
	idem, obs := newIdem(t, testConfig{Store: store, LeaseTTL: 3 * time.Second, NackDelay: 20 * time.Millisecond,
		StoreTimeout: 500 * time.Millisecond})
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })

	const n = 300
	effects := newLedger()
	var ackedWithoutEffect atomic.Int32
	count := &acks{}
	checkAck := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && effects.count(msg.Metadata.Get("requestId")) == 0 {
				ackedWithoutEffect.Add(1)
			}
			return out, err
		}
	}
	startRouter(t, func(r *message.Router) {
		r.AddMiddleware(count.middleware, checkAck, idem.Middleware)
		r.AddConsumerHandler("h", "in", pubSub, func(msg *message.Message) error {
			effects.record(msg.Metadata.Get("requestId"))
			time.Sleep(2 * time.Millisecond)
			return nil
		})
	})
	go func() {
		for i := range n { // a steady stream that runs into the outage
			_ = pubSub.Publish("in", newMsg(fmt.Sprintf("key-%d", i), "p"))
			time.Sleep(5 * time.Millisecond)
		}
	}()
	require.Eventually(t, func() bool { return count.acked.Load() >= n/3 }, 30*time.Second, time.Millisecond)
	srv.Stop()
	time.Sleep(time.Second)
	srv.Start()
	require.Eventually(t, func() bool { return count.acked.Load() == n }, 60*time.Second, 5*time.Millisecond,
		"everything completes after the restart")
	effects.exactlyOnce(t, n)
	assert.Zero(t, ackedWithoutEffect.Load(), "nothing acked without success")
	assert.Greater(t, obs.get(idempotency.OutcomeStoreUnavailable), 0, "the outage was felt: messages were nacked")
	t.Logf("acked %d, nacked %d during the outage", count.acked.Load(), count.nacked.Load())
}

// TestRedisLostRepliesThroughTheMiddleware drops, after Redis ran it, the
// reply of a message's claim, then of its Complete, then of a failing
// message's Fail; go-redis resends each. The message runs once on its first
// delivery, with no in_progress stall behind its own claim and no false
// lease_lost, and the failed one is FAILED, not reported lost.
func TestRedisLostRepliesThroughTheMiddleware(t *testing.T) {
	srv := testserver.StartRedis(t)
	proxy := testserver.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: proxy.Addr}) // go-redis's default MaxRetries: 3
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(client, nil)
	require.NoError(t, err)
	idem, obs := newIdem(t, testConfig{Store: store})
	h := &counter{}
	warm := newMsg("warm", "p") // loads the scripts, so a dropped reply is the script's own
	_, err = idem.Middleware(h.handle)(warm)
	require.NoError(t, err)

	for _, tc := range []struct{ name, key string }{{"claim", "lost-claim"}, {"complete", "lost-complete"}} {
		msg := newMsg(tc.key, "p")
		key, err := idem.StoreKey(msg)
		require.NoError(t, err)
		drops := proxy.Dropped()
		if tc.name == "claim" {
			proxy.DropReply(testserver.Command("set", key)) // the plain claim
		} else {
			proxy.DropReply(testserver.Command("evalsha", key)) // the first script on the key: its Complete
		}
		_, err = idem.Middleware(h.handle)(msg)
		require.NoError(t, err, "%s: processed on the first delivery", tc.name)
		require.Equal(t, drops+1, proxy.Dropped(), "%s: a reply was dropped", tc.name)
		rec, err := store.Get(context.Background(), key)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State, tc.name)
	}
	assert.EqualValues(t, 3, h.runs.Load())
	assert.Equal(t, 3, obs.get(idempotency.OutcomeProcessed))
	assert.Zero(t, obs.get(idempotency.OutcomeInProgress), "no stall behind its own claim")
	assert.Zero(t, obs.get(idempotency.OutcomeLeaseLost), "no false lease_lost")

	failing := &counter{}
	failing.failFor.Store(1)
	msg := newMsg("lost-fail", "p")
	key, err := idem.StoreKey(msg)
	require.NoError(t, err)
	proxy.DropReply(func(cmd []string) bool { return len(cmd) == 6 && cmd[3] == key }) // Fail: token, ttl
	_, err = idem.Middleware(failing.handle)(msg)
	require.ErrorIs(t, err, errHandler)
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State, "the resent Fail was applied once")
	assert.Equal(t, 1, rec.Attempts)
}

// TestRedisClaimWithoutAnswerIsReleased: a claim that Redis applied but
// whose reply never reached the consumer (the connection dropped, and this
// client does not resend) is nacked as store_unavailable and then released
// with its token, so the redelivery runs the handler at once as the key's
// first attempt: no stall until the lease lapses, and with MaxAttempts 1 no
// poisoning of a message that never ran.
func TestRedisClaimWithoutAnswerIsReleased(t *testing.T) {
	srv := testserver.StartRedis(t)
	proxy := testserver.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(client, nil)
	require.NoError(t, err)
	idem, obs := newIdem(t, testConfig{Store: store, MaxAttempts: 1})
	h := &counter{}
	_, err = idem.Middleware(h.handle)(newMsg("warm", "p")) // loads the scripts
	require.NoError(t, err)

	msg := newMsg("unanswered", "p")
	key, err := idem.StoreKey(msg)
	require.NoError(t, err)
	proxy.DropReply(testserver.Command("set", key)) // the plain claim
	_, err = idem.Middleware(h.handle)(msg)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "no answer: nacked, nothing ran")
	require.Equal(t, 1, proxy.Dropped())
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, idempotency.StateAbsent, rec.State, "the unanswered claim was released before the nack")

	_, err = idem.Middleware(h.handle)(msg)
	require.NoError(t, err, "the redelivery runs at once, as the first attempt")
	assert.EqualValues(t, 2, h.runs.Load())
	assert.Zero(t, obs.get(idempotency.OutcomeInProgress))
	assert.Zero(t, obs.get(idempotency.OutcomeTooManyAttempts))
	assert.Equal(t, 1, obs.op("release"))
}

// The claim returns the record it installed, IN_PROGRESS under the
// lease's token.
func TestLeaseRecordIsTheClaimedRecord(t *testing.T) {
	store, _ := sharedRedisStore(t)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	key := "test-" + watermill.NewShortUUID()
	lease, claim, err := once.Claim(context.Background(), key, []byte("fp"))
	require.NoError(t, err)
	require.NotNil(t, lease)
	defer lease.Fail()
	got := claim.Record
	assert.Equal(t, idempotency.StateInProgress, got.State)
	assert.NotEmpty(t, got.Token)
	assert.Equal(t, 1, got.Attempts)
	assert.Equal(t, []byte("fp"), got.Fingerprint)
	assert.False(t, got.CreatedAt.IsZero())
	assert.False(t, got.LeaseExpiresAt.IsZero())
}
