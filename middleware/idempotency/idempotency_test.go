package idempotency_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/faultstore"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

func TestAcquiredSuccessStoresCompleted(t *testing.T) {
	store := memstore.New(memstore.Config{})
	idem, obs := newIdem(t, testConfig{Store: store})
	h := &counter{outputs: func(msg *message.Message) []*message.Message {
		out := message.NewMessage("out-"+msg.UUID, []byte("derived"))
		out.Metadata.Set("origin", msg.UUID)
		return []*message.Message{out}
	}}
	msg := newMsg("req-1", "p")
	out, err := idem.Middleware(h.handle)(msg)
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.Equal(t, "out-"+msg.UUID, out[0].UUID)
	assert.EqualValues(t, 1, h.runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))

	key, err := idem.StoreKey(msg)
	require.NoError(t, err)
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, 1, rec.Attempts)
	assert.Equal(t, 1, obs.op("claim"), "one claim")
	assert.Equal(t, 1, obs.op("complete"), "one complete")
	assert.Zero(t, obs.op("renew"), "a short handler is never renewed")
}

func TestAcquiredErrorStoresFailedAndRetries(t *testing.T) {
	store := memstore.New(memstore.Config{})
	idem, obs := newIdem(t, testConfig{Store: store})
	h := &counter{}
	h.failFor.Store(1)
	msg := newMsg("req-1", "p")
	_, err := idem.Middleware(h.handle)(msg)
	require.ErrorIs(t, err, errHandler, "the handler's error goes to the router: nack")
	assert.False(t, idempotency.IsPermanent(err))
	key, _ := idem.StoreKey(msg)
	rec, _ := store.Get(context.Background(), key)
	assert.Equal(t, idempotency.StateFailed, rec.State)
	assert.Equal(t, 1, rec.Attempts)

	_, err = idem.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err, "the redelivery runs the handler again")
	assert.EqualValues(t, 2, h.runs.Load())
	rec, _ = store.Get(context.Background(), key)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, 2, rec.Attempts)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))
}

func TestCompletedDuplicateReplaysOutput(t *testing.T) {
	idem, obs := newIdem(t, testConfig{Store: memstore.New(memstore.Config{})})
	h := &counter{outputs: func(msg *message.Message) []*message.Message {
		a := message.NewMessage(watermill.NewUUID(), []byte("first\x00payload"))
		a.Metadata.Set("requestId", "down-"+msg.Metadata.Get("requestId"))
		a.Metadata.Set("empty", "")
		b := message.NewMessage(watermill.NewUUID(), nil)
		return []*message.Message{a, b}
	}}
	first, err := idem.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err)

	dup, err := idem.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err, "a duplicate is acked")
	assert.EqualValues(t, 1, h.runs.Load(), "the handler is not called for a duplicate")
	require.Len(t, dup, 2)
	for i := range first {
		assert.Equal(t, first[i].UUID, dup[i].UUID, "same UUIDs, so the next hop deduplicates too")
		assert.Equal(t, first[i].Metadata, dup[i].Metadata)
		assert.Equal(t, string(first[i].Payload), string(dup[i].Payload))
	}
	assert.Equal(t, 1, obs.get(idempotency.OutcomeDuplicate))
}

func TestInProgressIsNackedAfterDelay(t *testing.T) {
	store := memstore.New(memstore.Config{})
	const delay = 50 * time.Millisecond
	idem, obs := newIdem(t, testConfig{Store: store, NackDelay: delay})
	msg := newMsg("req-1", "p")
	key, _ := idem.StoreKey(msg)
	_, err := store.Claim(context.Background(), key, claimFor(time.Minute, nil)) // another consumer holds it
	require.NoError(t, err)

	h := &counter{}
	start := time.Now()
	_, err = idem.Middleware(h.handle)(msg)
	require.ErrorIs(t, err, idempotency.ErrInProgress)
	assert.False(t, idempotency.IsPermanent(err))
	assert.GreaterOrEqual(t, time.Since(start), delay, "the nack waits NackDelay")
	assert.Zero(t, h.runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeInProgress))
}

// downStore is a Redis store on a port where nothing listens: every call
// fails as it does when Redis is down.
func downStore(t *testing.T) idempotency.Store {
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client)
	require.NoError(t, err)
	return s
}

func TestStoreUnavailableFailsClosed(t *testing.T) {
	idem, obs := newIdem(t, testConfig{Store: downStore(t)})
	h := &counter{}
	_, err := idem.Middleware(h.handle)(newMsg("req-1", "p"))
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "nack: nothing is lost")
	assert.Contains(t, err.Error(), "127.0.0.1:1")
	assert.False(t, idempotency.IsPermanent(err))
	assert.Zero(t, h.runs.Load(), "the handler does not run without a claim")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeStoreUnavailable))
}

func TestStoreUnavailableFailOpen(t *testing.T) {
	idem, obs := newIdem(t, testConfig{Store: downStore(t), FailOpen: true})
	h := &counter{}
	_, err := idem.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err)
	assert.EqualValues(t, 1, h.runs.Load(), "fail open runs the handler without deduplication")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeFailOpen))
}

func TestMissingKey(t *testing.T) {
	idem, obs := newIdem(t, testConfig{Store: memstore.New(memstore.Config{})})
	h := &counter{}
	msg := message.NewMessage("", []byte("p"))
	_, err := idem.Middleware(h.handle)(msg)
	require.ErrorIs(t, err, idempotency.ErrMissingKey)
	assert.True(t, idempotency.IsPermanent(err))
	assert.Zero(t, h.runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeMissingKey))

	byFunc, _ := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}),
		KeyFunc: func(*message.Message) (string, error) { return "", errors.New("no order id") }})
	_, err = byFunc.Middleware(h.handle)(newMsg("req", "p"))
	require.ErrorIs(t, err, idempotency.ErrMissingKey)
	assert.Contains(t, err.Error(), "no order id")
}

func TestKeyDerivation(t *testing.T) {
	idem, _ := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}),
		Scope: func(msg *message.Message) string { return msg.Metadata.Get("scope") }})
	key := func(meta map[string]string, uuid string) string {
		m := message.NewMessage(uuid, nil)
		for k, v := range meta {
			m.Metadata.Set(k, v)
		}
		k, err := idem.StoreKey(m)
		require.NoError(t, err)
		return k
	}
	assert.Equal(t, "idem:s:r1", key(map[string]string{"requestId": "r1", "Idempotency-Key": "i1", "scope": "s"}, "u"))
	assert.Equal(t, "idem:s:i1", key(map[string]string{"Idempotency-Key": "i1", "scope": "s"}, "u"))
	assert.Equal(t, "idem:s:u", key(map[string]string{"scope": "s"}, "u"))
	assert.NotEqual(t, key(map[string]string{"scope": "a:b", "requestId": "c"}, "u"),
		key(map[string]string{"scope": "a", "requestId": "b:c"}, "u"), "scope and key never collide")
	assert.Equal(t, "idem:a%3Ab%25:c", key(map[string]string{"scope": "a:b%", "requestId": "c"}, "u"))

	long := strings.Repeat("x", 300)
	k1 := key(map[string]string{"requestId": long + "1"}, "u")
	k2 := key(map[string]string{"requestId": long + "2"}, "u")
	assert.True(t, strings.HasPrefix(k1, "idem::sha256:"), k1)
	assert.Len(t, k1, len("idem::sha256:")+64)
	assert.NotEqual(t, k1, k2, "long keys that differ anywhere stay different")
	exact := strings.Repeat("y", 200)
	assert.Equal(t, "idem::"+exact, key(map[string]string{"requestId": exact}, "u"), "keys up to the bound are kept")
	odd := "a\x00b\n\xff"
	assert.Equal(t, "idem::"+odd, key(map[string]string{"requestId": odd}, "u"))
}

// TestKeyFuncReplacesTheDefault: a KeyFunc decides the key alone; the
// metadata the default reads and the UUID are then ignored.
func TestKeyFuncReplacesTheDefault(t *testing.T) {
	t.Parallel()
	byOrder, _ := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}),
		KeyFunc: func(msg *message.Message) (string, error) { return msg.Metadata.Get("orderId"), nil }})
	msg := newMsg("req-1", "p")
	msg.Metadata.Set("orderId", "o-7")
	key, err := byOrder.StoreKey(msg)
	require.NoError(t, err)
	assert.Equal(t, "idem::o-7", key)
	_, err = byOrder.StoreKey(newMsg("req-1", "p"))
	require.ErrorIs(t, err, idempotency.ErrMissingKey, "an empty key from KeyFunc, whatever the metadata")
}

func TestTooManyAttempts(t *testing.T) {
	store := memstore.New(memstore.Config{})
	idem, obs := newIdem(t, testConfig{Store: store, MaxAttempts: 2})
	h := &counter{}
	h.failFor.Store(100)
	for range 2 {
		_, err := idem.Middleware(h.handle)(newMsg("poison", "p"))
		require.ErrorIs(t, err, errHandler)
	}
	_, err := idem.Middleware(h.handle)(newMsg("poison", "p"))
	require.ErrorIs(t, err, idempotency.ErrTooManyAttempts)
	assert.True(t, idempotency.IsPermanent(err))
	assert.EqualValues(t, 2, h.runs.Load(), "the handler ran MaxAttempts times, not more")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeTooManyAttempts))
	_, err = idem.Middleware(h.handle)(newMsg("poison", "p"))
	require.ErrorIs(t, err, idempotency.ErrTooManyAttempts, "and keeps refusing")
	assert.EqualValues(t, 2, h.runs.Load())
}

func TestKeyReusedWithDifferentPayload(t *testing.T) {
	idem, obs := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}), CheckPayload: true})
	h := &counter{}
	_, err := idem.Middleware(h.handle)(newMsg("req-1", "pay 10"))
	require.NoError(t, err)
	_, err = idem.Middleware(h.handle)(newMsg("req-1", "pay 10"))
	require.NoError(t, err, "same payload: a plain duplicate")
	_, err = idem.Middleware(h.handle)(newMsg("req-1", "pay 99"))
	require.ErrorIs(t, err, idempotency.ErrKeyReused)
	assert.True(t, idempotency.IsPermanent(err))
	assert.EqualValues(t, 1, h.runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeKeyReused))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeDuplicate))
}

func TestLeaseIsRenewedWhileHandlerRuns(t *testing.T) {
	store := memstore.New(memstore.Config{})
	const lease = 150 * time.Millisecond
	idem, obs := newIdem(t, testConfig{Store: store, LeaseTTL: lease})
	h := &counter{block: make(chan struct{})}
	first := newMsg("slow", "p")
	done := make(chan error, 1)
	go func() { _, err := idem.Middleware(h.handle)(first); done <- err }()
	require.Eventually(t, func() bool { return h.runs.Load() == 1 }, time.Second, time.Millisecond)

	// For four leases, copies keep arriving; none may run the handler.
	deadline := time.Now().Add(4 * lease)
	for time.Now().Before(deadline) {
		_, err := idem.Middleware(h.handle)(newMsg("slow", "p"))
		require.ErrorIs(t, err, idempotency.ErrInProgress)
		time.Sleep(10 * time.Millisecond)
	}
	close(h.block)
	require.NoError(t, <-done, "a live but slow handler keeps its lease")
	assert.EqualValues(t, 1, h.runs.Load())
	assert.GreaterOrEqual(t, obs.op("renew"), 3, "renewed every lease/3")
}

func TestLostLeaseCancelsHandlerContext(t *testing.T) {
	store := memstore.New(memstore.Config{})
	idem, obs := newIdem(t, testConfig{Store: store, LeaseTTL: 90 * time.Millisecond})
	h := &counter{block: make(chan struct{})} // never closed: only the context ends it
	msg := newMsg("taken", "p")
	key, _ := idem.StoreKey(msg)
	done := make(chan error, 1)
	go func() { _, err := idem.Middleware(h.handle)(msg); done <- err }()
	require.Eventually(t, func() bool { return h.runs.Load() == 1 }, time.Second, time.Millisecond)

	// Another owner takes the key over (as after an expired lease).
	require.NoError(t, store.Delete(context.Background(), key))
	req := claimFor(time.Minute, nil)
	res, err := store.Claim(context.Background(), key, req)
	require.NoError(t, err)
	require.True(t, res.Acquired)

	select {
	case err := <-done:
		require.ErrorIs(t, err, idempotency.ErrLeaseLost, "the handler saw context.Cause = ErrLeaseLost")
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not cancelled after the lease was lost")
	}
	rec, _ := store.Get(context.Background(), key)
	assert.Equal(t, req.Token, rec.Token, "the stale owner changed nothing")
	assert.Equal(t, idempotency.StateInProgress, rec.State)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed))
}

func TestCompleteFailureIsRetriedAndNeverNacks(t *testing.T) {
	inner := memstore.New(memstore.Config{})
	store := faultstore.New(inner).On("complete", faultstore.First(3, faultstore.Fail(errors.New("connection refused"))))
	idem, obs := newIdem(t, testConfig{Store: store, LeaseTTL: 5 * time.Second})
	h := &counter{}
	msg := newMsg("req-1", "p")
	_, err := idem.Middleware(h.handle)(msg)
	require.NoError(t, err)
	key, _ := idem.StoreKey(msg)
	rec, _ := inner.Get(context.Background(), key)
	assert.Equal(t, idempotency.StateCompleted, rec.State, "retried within the lease until written")
	assert.Equal(t, 4, obs.op("complete"))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))

	// A store that stays down past the lease: still acked, counted.
	down := faultstore.New(inner).On("complete", faultstore.Fail(errors.New("connection refused")))
	idem2, obs2 := newIdem(t, testConfig{Store: down, LeaseTTL: 200 * time.Millisecond})
	out, err := idem2.Middleware((&counter{outputs: func(*message.Message) []*message.Message {
		return []*message.Message{message.NewMessage("o", nil)}
	}}).handle)(newMsg("req-2", "p"))
	require.NoError(t, err, "never a nack after the effect happened")
	require.Len(t, out, 1, "the output is still published")
	assert.Equal(t, 1, obs2.get(idempotency.OutcomeCompleteFailed))
}

func TestPanicRecordsFailure(t *testing.T) {
	store := memstore.New(memstore.Config{})
	idem, obs := newIdem(t, testConfig{Store: store})
	msg := newMsg("req-1", "p")
	require.PanicsWithValue(t, "boom", func() {
		_, _ = idem.Middleware(func(*message.Message) ([]*message.Message, error) { panic("boom") })(msg)
	})
	key, _ := idem.StoreKey(msg)
	rec, _ := store.Get(context.Background(), key)
	assert.Equal(t, idempotency.StateFailed, rec.State, "a panic lets the next delivery retry")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed))
}

func TestOversizedOutputIsNotStored(t *testing.T) {
	idem, obs := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}), MaxOutputSize: 64})
	h := &counter{outputs: func(*message.Message) []*message.Message {
		return []*message.Message{message.NewMessage("big", make([]byte, 100))}
	}}
	out, err := idem.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err)
	require.Len(t, out, 1, "the first run still returns its output")
	dup, err := idem.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err, "the duplicate is acked")
	assert.Empty(t, dup, "without the output that was too large to store")
	assert.EqualValues(t, 1, h.runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeDuplicate))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeOutputNotStored), "the output that was not stored is counted")
	assert.Equal(t, 0, obs.get(idempotency.OutcomeProcessed), "and not as processed")
}

func TestDisableOutputReplay(t *testing.T) {
	idem, _ := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}), DisableOutputReplay: true})
	h := &counter{outputs: func(*message.Message) []*message.Message {
		return []*message.Message{message.NewMessage("o", []byte("x"))}
	}}
	_, err := idem.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err)
	dup, err := idem.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err)
	assert.Empty(t, dup)
	assert.EqualValues(t, 1, h.runs.Load())
}

func TestConfigValidation(t *testing.T) {
	store := memstore.New(memstore.Config{})
	for name, cfg := range map[string]testConfig{
		"no store":         {},
		"negative lease":   {Store: store, LeaseTTL: -time.Second},
		"negative ttl":     {Store: store, CompletedTTL: -1},
		"negative failed":  {Store: store, FailedTTL: -1},
		"negative timeout": {Store: store, StoreTimeout: -1},
		"tiny lease":       {Store: store, LeaseTTL: time.Microsecond},
		"negative max":     {Store: store, MaxAttempts: -1},
		"negative output":  {Store: store, MaxOutputSize: -1},
		"prefix separator": {Store: store, KeyPrefix: "a:b"},
	} {
		_, err := newMiddleware(cfg, nil)
		assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, name)
	}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	oc := once.Config()
	assert.Equal(t, 40*time.Second, oc.LeaseTTL)
	assert.Equal(t, 24*time.Hour, oc.CompletedTTL)
	assert.Equal(t, 24*time.Hour, oc.FailedTTL)
	assert.Equal(t, 5*time.Second, oc.StoreTimeout)
	assert.Equal(t, 1<<20, oc.MaxOutputSize)
	assert.Equal(t, 16<<20, oc.CacheMaxBytes)
	assert.Equal(t, watermill.NopLogger{}, oc.Logger)
	idem, err := idempotency.New(once, nil)
	require.NoError(t, err)
	cfg := idem.Config()
	assert.Equal(t, "idem", cfg.KeyPrefix)
	assert.Equal(t, time.Second, cfg.NackDelay)
	_, err = idempotency.New(nil, nil)
	assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, "a Once is required")
}

// TestValidateReportsEveryProblem: every problem, one per line, in the order
// of the fields, each worded as in the adapters.
func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	err := validate(idempotency.OnceConfig{
		LeaseTTL: 2 * time.Millisecond, CompletedTTL: -1, StoreTimeout: -time.Second, MaxAttempts: -1,
		CacheMaxBytes: -3, MaxOutputSize: -5,
	})
	require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
	assert.EqualError(t, err, `idempotency: invalid config: Store is required
idempotency: invalid config: CompletedTTL is -1ns, must not be negative
idempotency: invalid config: StoreTimeout is -1s, must not be negative
idempotency: invalid config: LeaseTTL 2ms is too short to renew every LeaseTTL/3
idempotency: invalid config: MaxAttempts is -1, must be 0 (unlimited) or more
idempotency: invalid config: MaxOutputSize is -5, must not be negative`)
}

func TestDifferentPayloadWhileInProgressIsNackedNotPoisoned(t *testing.T) {
	store := memstore.New(memstore.Config{})
	idem, _ := newIdem(t, testConfig{Store: store, CheckPayload: true})
	msg := newMsg("req-1", "pay 10")
	key, _ := idem.StoreKey(msg)
	sum := sha256.Sum256([]byte("pay 10"))
	_, err := store.Claim(context.Background(), key, claimFor(time.Minute, sum[:])) // the first run is going on
	require.NoError(t, err)
	_, err = idem.Middleware((&counter{}).handle)(newMsg("req-1", "pay 99"))
	require.ErrorIs(t, err, idempotency.ErrInProgress, "decided once the first run ends")
	assert.False(t, idempotency.IsPermanent(err))
}

func TestLiteralKeyCannotTakeAHashedKeysPlace(t *testing.T) {
	idem, _ := newIdem(t, testConfig{Store: memstore.New(memstore.Config{})})
	long := strings.Repeat("z", 300)
	hashed, err := idem.StoreKey(newMsg(long, "p"))
	require.NoError(t, err)
	_, literal, _ := strings.Cut(hashed, "::") // "sha256:<hex>" as a producer could send it
	forged, err := idem.StoreKey(newMsg(literal, "p"))
	require.NoError(t, err)
	assert.NotEqual(t, hashed, forged)
}

func TestCompleteWhoseReplyWasLostIsConfirmed(t *testing.T) {
	idem, obs := newIdem(t, testConfig{Store: faultstore.New(memstore.New(memstore.Config{})).On("complete", faultstore.First(1, faultstore.LoseReply(errors.New("i/o timeout"))))})
	_, err := idem.Middleware((&counter{}).handle)(newMsg("req-1", "p"))
	require.NoError(t, err)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed), "the retry's lease_lost was the first try's success")
	assert.Zero(t, obs.get(idempotency.OutcomeLeaseLost))
}
