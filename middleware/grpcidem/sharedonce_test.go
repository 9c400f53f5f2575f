package grpcidem_test

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// threeAdapters is one Once, with its one cache, shared by the Watermill
// middleware, httpidem and grpcidem, as the README builds a process.
type threeAdapters struct {
	wm        *idempotency.Middleware
	httpURL   string
	grpc      testpb.LedgerClient
	ledger    *ledger
	httpRuns  atomic.Int64
	wmRuns    atomic.Int64
	wmHandler message.HandlerFunc
}

// newThreeAdapters builds the three adapters on one Once on a store of
// kind. Their prefixes are the test's own, then "w", httpSuffix and
// grpcSuffix; wmCfg.KeyPrefix is kept when set.
func newThreeAdapters(t *testing.T, kind storeKind, wmCfg idempotency.Config, httpSuffix, grpcSuffix string) *threeAdapters {
	t.Helper()
	store, kp := kind.New(t)
	if kind.Name == "redisstore" {
		client := testserver.RedisClient(t)
		t.Cleanup(func() {
			ctx := context.Background()
			iter := client.Scan(ctx, 0, kp+"*", 100).Iterator()
			for iter.Next(ctx) {
				_ = client.Del(ctx, iter.Val()).Err()
			}
		})
	}
	wmCfg.KeyPrefix = cmp.Or(wmCfg.KeyPrefix, kp+"w")
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	return threeAdaptersOn(t, once, wmCfg, kp+httpSuffix, kp+grpcSuffix)
}

// threeAdaptersOn builds the three adapters on once, with these prefixes.
func threeAdaptersOn(t *testing.T, once *idempotency.Once, wmCfg idempotency.Config, httpPrefix, grpcPrefix string) *threeAdapters {
	t.Helper()
	a := &threeAdapters{ledger: newLedger()}
	var err error
	a.wm, err = idempotency.New(once, &wmCfg)
	require.NoError(t, err)
	a.wmHandler = a.wm.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		n := a.wmRuns.Add(1)
		return []*message.Message{message.NewMessage(fmt.Sprintf("out-%d", n), []byte("watermill output"))}, nil
	})

	h, err := httpidem.New(once, &httpidem.Config{KeyPrefix: httpPrefix, Scope: func(r *http.Request) string { return r.Header.Get("Tenant") }})
	require.NoError(t, err)
	srv := httptest.NewServer(h.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := a.httpRuns.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "http run %d", n)
	})))
	t.Cleanup(srv.Close)
	a.httpURL = srv.URL

	g, err := grpcidem.New(once, &grpcidem.Config{KeyPrefix: grpcPrefix, Scope: tenantScope, Methods: []string{methodCharge}})
	require.NoError(t, err)
	a.grpc = dial(t, serve(t, a.ledger, g.UnaryServerInterceptor))
	return a
}

func (a *threeAdapters) post(t *testing.T, tenant, key string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, a.httpURL, strings.NewReader("{}"))
	require.NoError(t, err)
	req.Header.Set("Tenant", tenant)
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func (a *threeAdapters) message(t *testing.T, key string) []*message.Message {
	t.Helper()
	msg := message.NewMessage("uuid-"+key, []byte("payload"))
	msg.Metadata.Set("requestId", key)
	out, err := a.wmHandler(msg)
	require.NoError(t, err)
	return out
}

// TestOneOnceThreeAdapters: the same scope text and the same key through
// the three adapters of one Once are three keys, on the store and in the
// cache: each runs once, and each repeat gets its own adapter's answer,
// never another adapter's.
func TestOneOnceThreeAdapters(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		const scope, key = "alice", "k1"
		a := newThreeAdapters(t, kind, idempotency.Config{Scope: func(*message.Message) string { return scope }}, "h", "g")
		for i := range 3 {
			out := a.message(t, key)
			require.Len(t, out, 1, "delivery %d", i)
			assert.Equal(t, "out-1", out[0].UUID)

			status, body := a.post(t, scope, key)
			assert.Equal(t, http.StatusCreated, status, "request %d", i)
			assert.Equal(t, "http run 1", body)

			ans := charge(t, a.grpc, scope, key, &testpb.ChargeRequest{Amount: 7})
			require.NoError(t, ans.err, "call %d", i)
			assert.EqualValues(t, 1, ans.reply.GetRun())
			assert.Equal(t, i > 0, ans.replayed())
		}
		assert.EqualValues(t, 1, a.wmRuns.Load())
		assert.EqualValues(t, 1, a.httpRuns.Load())
		assert.EqualValues(t, 1, a.ledger.runs.Load())
	})
}

// TestSharedPrefixAcrossAdapters: no two (prefix, scope, key) triples of
// one Once's adapters share a stored key. The Watermill middleware writes
// its scope as text, httpidem and grpcidem as a hash, so a message's scope
// may read as a tenant's hash: one Once refuses that layout and the other
// under one KeyPrefix, in either order. httpidem and grpcidem may share a
// prefix (one layout): the same scope and key is then one key, and a call
// that meets a request's record is a reused key, never its answer.
func TestSharedPrefixAcrossAdapters(t *testing.T) {
	const prefix, scope, key = "shared", "alice", "k1"
	sum := sha256.Sum256([]byte(scope))
	hashText := hex.EncodeToString(sum[:16])
	newOnce := func(t *testing.T) *idempotency.Once {
		once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil)})
		require.NoError(t, err)
		return once
	}
	httpCfg := &httpidem.Config{KeyPrefix: prefix, SingleTenant: true}
	grpcCfg := &grpcidem.Config{KeyPrefix: prefix, SingleTenant: true, Methods: []string{methodCharge}}
	wmCfg := &idempotency.Config{KeyPrefix: prefix, Scope: func(*message.Message) string { return hashText }}

	t.Run("Watermill first", func(t *testing.T) {
		once := newOnce(t)
		_, err := idempotency.New(once, wmCfg)
		require.NoError(t, err)
		_, err = httpidem.New(once, httpCfg)
		require.ErrorIs(t, err, httpidem.ErrInvalidConfig)
		assert.Contains(t, err.Error(), `"shared"`)
		_, err = grpcidem.New(once, grpcCfg)
		require.ErrorIs(t, err, grpcidem.ErrInvalidConfig)
		_, err = idempotency.New(once, wmCfg)
		require.NoError(t, err, "two Watermill middlewares share a prefix")
	})
	t.Run("HTTP first", func(t *testing.T) {
		once := newOnce(t)
		_, err := httpidem.New(once, httpCfg)
		require.NoError(t, err)
		_, err = grpcidem.New(once, grpcCfg)
		require.NoError(t, err, "httpidem and grpcidem store keys alike")
		_, err = idempotency.New(once, wmCfg)
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
		_, err = idempotency.New(once, &idempotency.Config{KeyPrefix: "other"})
		require.NoError(t, err)
	})
	t.Run("default prefix taken", func(t *testing.T) {
		once := newOnce(t)
		_, err := idempotency.New(once, nil)
		require.NoError(t, err)
		_, err = httpidem.New(once, &httpidem.Config{KeyPrefix: "idem", SingleTenant: true})
		require.ErrorIs(t, err, httpidem.ErrInvalidConfig, `"idem" is the Watermill middleware's`)
	})
	eachStore(t, func(t *testing.T, kind storeKind) {
		a := newThreeAdapters(t, kind, idempotency.Config{}, "s", "s")
		status, _ := a.post(t, scope, key)
		require.Equal(t, http.StatusCreated, status)
		ans := charge(t, a.grpc, scope, key, &testpb.ChargeRequest{Amount: 7})
		requireReason(t, ans.err, codes.FailedPrecondition, keyReused)
		charge(t, a.grpc, scope, "k2", &testpb.ChargeRequest{Amount: 7})
		status, body := a.post(t, scope, "k2")
		assert.Equal(t, http.StatusUnprocessableEntity, status, body)
		assert.EqualValues(t, 1, a.httpRuns.Load())
		assert.EqualValues(t, 1, a.ledger.runs.Load())
	})
}

// TestKeyLengthBoundOnEveryAdapter: a key of 200 bytes is stored as
// given, one of 201 hashed, and a key that spells the hashed form of
// another ("sha256:" and its hex) is hashed again: through every adapter
// of one Once these are three keys, none refused, each run once.
func TestKeyLengthBoundOnEveryAdapter(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		a := newThreeAdapters(t, kind, idempotency.Config{Scope: func(*message.Message) string { return "s" }}, "h", "g")
		k200 := strings.Repeat("k", 200)
		k201 := k200 + "k"
		sum := sha256.Sum256([]byte(k201))
		spelt := "sha256:" + hex.EncodeToString(sum[:])
		for i, key := range []string{k200, k201, spelt} {
			for range 2 {
				status, body := a.post(t, "s", key)
				require.Equal(t, http.StatusCreated, status, body)
				assert.Equal(t, fmt.Sprintf("http run %d", i+1), body)

				out := a.message(t, key)
				require.Len(t, out, 1)
				assert.Equal(t, fmt.Sprintf("out-%d", i+1), out[0].UUID)

				ans := charge(t, a.grpc, "s", key, &testpb.ChargeRequest{Amount: 7})
				require.NoError(t, ans.err)
				assert.EqualValues(t, i+1, ans.reply.GetRun())
			}
		}
		assert.EqualValues(t, 3, a.httpRuns.Load())
		assert.EqualValues(t, 3, a.wmRuns.Load())
		assert.EqualValues(t, 3, a.ledger.runs.Load())
	})
}

// TestStoreStoppedUnderOneOnce: a redis-server killed under one Once shared
// by every adapter. A key each adapter saw COMPLETED is still answered from
// the cache, never run again; a new key runs nothing (503, UNAVAILABLE, a
// nack, ErrStoreUnavailable), unless FailOpen runs it unguarded.
func TestStoreStoppedUnderOneOnce(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOpen=%v", failOpen), func(t *testing.T) {
			srv := testserver.StartRedis(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
			t.Cleanup(func() { _ = client.Close() })
			store, err := redisstore.New(client, nil)
			require.NoError(t, err)
			once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, FailOpen: failOpen, StoreTimeout: time.Second})
			require.NoError(t, err)
			a := threeAdaptersOn(t, once, idempotency.Config{Scope: func(*message.Message) string { return "s" }, NackDelay: -1}, "h", "g")
			var doRuns atomic.Int64
			do := func(key string) (idempotency.Result, error) {
				return once.Do(t.Context(), "do:"+key, func(context.Context) ([]byte, error) {
					return []byte(fmt.Sprintf("do run %d", doRuns.Add(1))), nil
				})
			}
			// Completed while the store is up.
			status, _ := a.post(t, "s", "old")
			require.Equal(t, http.StatusCreated, status)
			require.NoError(t, charge(t, a.grpc, "s", "old", &testpb.ChargeRequest{Amount: 1}).err)
			a.message(t, "old")
			_, err = do("old")
			require.NoError(t, err)

			srv.Stop()

			status, body := a.post(t, "s", "old")
			assert.Equal(t, http.StatusCreated, status)
			assert.Equal(t, "http run 1", body, "from the cache")
			ans := charge(t, a.grpc, "s", "old", &testpb.ChargeRequest{Amount: 1})
			require.NoError(t, ans.err)
			assert.True(t, ans.replayed())
			out := a.message(t, "old")
			require.Len(t, out, 1)
			assert.Equal(t, "out-1", out[0].UUID)
			res, err := do("old")
			require.NoError(t, err)
			assert.Equal(t, idempotency.Result{Value: []byte("do run 1"), Outcome: idempotency.OutcomeDuplicate}, res)

			status, body = a.post(t, "s", "new")
			ans = charge(t, a.grpc, "s", "new", &testpb.ChargeRequest{Amount: 1})
			msg := message.NewMessage("uuid-new", []byte("payload"))
			msg.Metadata.Set("requestId", "new")
			_, wmErr := a.wmHandler(msg)
			res, doErr := do("new")
			if failOpen {
				assert.Equal(t, http.StatusCreated, status, body)
				require.NoError(t, ans.err)
				assert.False(t, ans.replayed())
				require.NoError(t, wmErr)
				require.NoError(t, doErr)
				assert.Equal(t, idempotency.OutcomeFailOpen, res.Outcome)
				assert.EqualValues(t, 2, a.httpRuns.Load())
				assert.EqualValues(t, 2, a.ledger.runs.Load())
				assert.EqualValues(t, 2, a.wmRuns.Load())
				assert.EqualValues(t, 2, doRuns.Load())
				return
			}
			assert.Equal(t, http.StatusServiceUnavailable, status, body)
			requireReason(t, ans.err, codes.Unavailable, storeUnavailable)
			require.ErrorIs(t, wmErr, idempotency.ErrStoreUnavailable)
			require.ErrorIs(t, doErr, idempotency.ErrStoreUnavailable)
			assert.EqualValues(t, 1, a.httpRuns.Load())
			assert.EqualValues(t, 1, a.ledger.runs.Load())
			assert.EqualValues(t, 1, a.wmRuns.Load())
			assert.EqualValues(t, 1, doRuns.Load())
		})
	}
}

// cacheLabels records the labels of an Observer's outcomes and cache
// lookups.
type cacheLabels struct {
	mu                sync.Mutex
	outcomes, lookups []string
}

func (o *cacheLabels) Outcome(_ context.Context, d idempotency.OutcomeDetails) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes = append(o.outcomes, d.Handler)
}
func (*cacheLabels) StoreLatency(string, time.Duration, error) {}
func (o *cacheLabels) CacheLookup(handler string, _ bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lookups = append(o.lookups, handler)
}

// TestCacheLookupLabels: the Observer's cache lookups of each adapter of
// one Once carry the label of that adapter's outcomes (the route, the
// method, the handler's name, "once" for Do), so a hit ratio per handler
// reads right.
func TestCacheLookupLabels(t *testing.T) {
	store, kp := storeKinds[1].New(t) // redisstore: an in-process store has no cache
	obs := &cacheLabels{}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: obs})
	require.NoError(t, err)
	a := threeAdaptersOn(t, once, idempotency.Config{KeyPrefix: kp + "w", Scope: func(*message.Message) string { return "orders" }}, kp+"h", kp+"g")
	t.Cleanup(func() {
		client := testserver.RedisClient(t)
		iter := client.Scan(context.Background(), 0, kp+"*", 100).Iterator()
		for iter.Next(context.Background()) {
			_ = client.Del(context.Background(), iter.Val()).Err()
		}
	})
	a.post(t, "s", "k")
	require.NoError(t, charge(t, a.grpc, "s", "k", &testpb.ChargeRequest{Amount: 1}).err)
	a.message(t, "k")
	_, err = once.Do(t.Context(), kp+"do", func(context.Context) ([]byte, error) { return nil, nil })
	require.NoError(t, err)

	obs.mu.Lock()
	defer obs.mu.Unlock()
	assert.Equal(t, []string{"http", methodCharge, "orders", "once"}, obs.outcomes)
	assert.Equal(t, obs.outcomes, obs.lookups)
}
