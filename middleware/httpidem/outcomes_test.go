package httpidem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
	"github.com/idempotency/watermill-idempotency/middleware/internal/faultstore"
)

// recordingObserver counts outcomes per label, and store calls per
// operation.
type recordingObserver struct {
	mu       sync.Mutex
	outcomes map[string]map[idempotency.Outcome]int
	ops      map[string]int
}

func newRecordingObserver() *recordingObserver {
	return &recordingObserver{outcomes: map[string]map[idempotency.Outcome]int{}, ops: map[string]int{}}
}

func (o *recordingObserver) CacheLookup(string, bool) {}

func (o *recordingObserver) Outcome(_ context.Context, d idempotency.OutcomeDetails) {
	label, outcome := d.Handler, d.Outcome
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.outcomes[label] == nil {
		o.outcomes[label] = map[idempotency.Outcome]int{}
	}
	o.outcomes[label][outcome]++
}

func (o *recordingObserver) StoreLatency(op string, _ time.Duration, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ops[op]++
}

func (o *recordingObserver) snapshot() (map[string]map[idempotency.Outcome]int, map[string]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]map[idempotency.Outcome]int{}
	for label, m := range o.outcomes {
		out[label] = map[idempotency.Outcome]int{}
		for k, v := range m {
			out[label][k] = v
		}
	}
	ops := map[string]int{}
	for k, v := range o.ops {
		ops[k] = v
	}
	return out, ops
}

// faultyStore answers by the client key at the end of the stored key:
// "corrupt" has a corrupt record, "down" cannot be claimed, "nocomplete"
// is never completed, "stolen" is completed by someone else first. Other
// keys pass through.
func faultyStore(inner idempotency.Store) *faultstore.Store {
	return faultstore.New(inner).
		On("claim", func(ctx context.Context, c faultstore.Call) error {
			switch {
			case strings.HasSuffix(c.Key, ":corrupt"):
				return fmt.Errorf("faulty: claim %q: %w", c.Key, idempotency.ErrCorruptRecord)
			case strings.HasSuffix(c.Key, ":down"):
				return fmt.Errorf("faulty: claim %q: connection refused", c.Key)
			}
			return c.Pass(ctx)
		}).
		On("complete", func(ctx context.Context, c faultstore.Call) error {
			switch {
			case strings.HasSuffix(c.Key, ":nocomplete"):
				return fmt.Errorf("faulty: complete %q: connection reset", c.Key)
			case strings.HasSuffix(c.Key, ":stolen"):
				return fmt.Errorf("faulty: complete %q: %w", c.Key, idempotency.ErrLeaseLost)
			}
			return c.Pass(ctx)
		})
}

// TestOutcomesObserved: every request the middleware applies to is counted
// once, under its ServeMux pattern, or "http" when no pattern matched it.
func TestOutcomesObserved(t *testing.T) {
	eachStoreInBubble(t, func(t *testing.T, kind storeKind) {
		inner, prefix := kind.New(t)
		store := faultyStore(inner)
		obs := newRecordingObserver()
		api := newPayments()
		adjust := func(c *config) {
			c.Observer = obs
			c.LeaseTTL = 150 * time.Millisecond // "nocomplete" retries for a lease
		}
		idem := newMiddleware(t, store, prefix, adjust)
		open := newMiddleware(t, store, prefix, func(c *config) { adjust(c); c.FailOpen = true })
		mux := http.NewServeMux()
		mux.Handle("POST /{path}", idem.Handler(api))
		mux.Handle("POST /open/{path}", open.Handler(api))
		const label = "POST /{path}"

		send := func(s step, wantStatus int) {
			t.Helper()
			got := serve(mux, newRequest(s))
			if wantStatus == 0 {
				require.NotNil(t, got.panicked, "the handler's panic goes on")
				return
			}
			require.Equal(t, wantStatus, got.status, got.body)
		}
		send(step{keys: key("k1"), body: "a"}, 201)                         // processed
		send(step{keys: key("k1"), body: "a"}, 201)                         // duplicate
		send(step{keys: key("k1"), body: "b"}, 422)                         // key_reused
		send(step{}, 400)                                                   // missing_key
		send(step{keys: key("a,b")}, 400)                                   // missing_key (invalid)
		send(step{keys: key("k2"), path: "/fail"}, 503)                     // handler_failed
		send(step{keys: key("k3"), path: "/panic"}, 0)                      // handler_failed
		send(step{keys: key("corrupt")}, 500)                               // corrupt_record
		send(step{keys: key("down")}, 503)                                  // store_unavailable
		send(step{keys: key("down"), path: "/open/pay"}, 201)               // fail_open, under its own pattern
		send(step{keys: key("nocomplete")}, 201)                            // complete_failed
		send(step{keys: key("stolen")}, 201)                                // lease_lost
		send(step{keys: key("k4"), body: strings.Repeat("x", 11<<20)}, 413) // refused before a claim: not counted

		blocked := make(chan result, 1)
		go func() { blocked <- serve(mux, newRequest(step{keys: key("k5"), path: "/block"})) }()
		<-api.started
		send(step{keys: key("k5"), path: "/block"}, 409) // in_progress
		close(api.release)
		require.Equal(t, http.StatusCreated, (<-blocked).status) // processed

		// A method the middleware does not apply to passes through, uncounted.
		require.Equal(t, http.StatusCreated, serve(idem.Handler(api), newRequest(step{method: http.MethodGet, keys: key("k1")})).status)
		// Without a ServeMux pattern, the label is "http".
		bare := serve(idem.Handler(api), newRequest(step{keys: key("k6")}))
		require.Equal(t, http.StatusCreated, bare.status)

		outcomes, ops := obs.snapshot()
		assert.Equal(t, map[string]map[idempotency.Outcome]int{
			label: {
				idempotency.OutcomeProcessed:        2,
				idempotency.OutcomeDuplicate:        1,
				idempotency.OutcomeKeyReused:        1,
				idempotency.OutcomeMissingKey:       2,
				idempotency.OutcomeHandlerFailed:    2,
				idempotency.OutcomeCorruptRecord:    1,
				idempotency.OutcomeStoreUnavailable: 1,
				idempotency.OutcomeCompleteFailed:   1,
				idempotency.OutcomeLeaseLost:        1,
				idempotency.OutcomeInProgress:       1,
			},
			"POST /open/{path}": {idempotency.OutcomeFailOpen: 1},
			"http":              {idempotency.OutcomeProcessed: 1},
		}, outcomes)
		assert.Positive(t, ops["claim"], "store latencies reach the observer")
		assert.Positive(t, ops["complete"])
	})
}

// TestCorruptRecord: a claim that finds a value that is not a record
// (idempotency.ErrCorruptRecord) is answered 500 with a problem body, runs
// nothing, and is logged at Error with the stored key for an operator.
func TestCorruptRecord(t *testing.T) {
	inner, prefix := storeKinds[0].New(t)
	api := newPayments()
	logger := watermill.NewCaptureLogger()
	m, err := build(config{OnceConfig: idempotency.OnceConfig{Store: faultyStore(inner), Logger: logger}, Config: httpidem.Config{KeyPrefix: prefix, Scope: tenantScope}})
	require.NoError(t, err)
	h := m.Handler(api)
	for range 2 {
		got := serve(h, newRequest(step{keys: key("corrupt"), tenant: "t"}))
		requireProblem(t, got, http.StatusInternalServerError, recordCorrupt)
	}
	assert.Zero(t, api.runs.Load(), "nothing runs over a record that cannot be read")
	errs := logger.Captured()[watermill.ErrorLogLevel]
	require.Len(t, errs, 2)
	assert.ErrorIs(t, errs[0].Err, idempotency.ErrCorruptRecord)
	assert.Equal(t, httpidem.StoreKey(prefix, "t", "corrupt"), errs[0].Fields["idempotency_key"], "the stored key, which ends with the client's")
	assert.Equal(t, string(idempotency.OutcomeCorruptRecord), errs[0].Fields["outcome"])
}

// TestBodyReachesClientWhileCompleting: while recording COMPLETED is slow,
// the client already has the whole body; only the end of the response
// waits for the store.
func TestBodyReachesClientWhileCompleting(t *testing.T) {
	inner, prefix := storeKinds[0].New(t)
	release := make(chan struct{}) // every Complete waits for it
	store := faultstore.New(inner).On("complete", faultstore.Hold(release, nil))
	api := newPayments()
	h := newMiddleware(t, store, prefix, func(c *config) {
		c.LeaseTTL = time.Minute
		c.StoreTimeout = time.Minute
	}).Handler(api)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader("p"))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k1")
	type read struct {
		status int
		body   string
		err    error
		resp   *http.Response
	}
	got := make(chan read, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err != nil {
			got <- read{err: err}
			return
		}
		want := `{"run":1,"method":"POST","body":"p"}`
		b := make([]byte, len(want))
		_, err = io.ReadFull(resp.Body, b)
		got <- read{status: resp.StatusCode, body: string(b), err: err, resp: resp}
	}()
	var r read
	select {
	case r = <-got:
	case <-time.After(30 * time.Second): // a hang guard, not a timing assertion
		t.Fatal("the body did not reach the client while COMPLETED was being recorded")
	}
	close(release)
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusCreated, r.status)
	assert.Equal(t, `{"run":1,"method":"POST","body":"p"}`, r.body)
	rest, err := io.ReadAll(r.resp.Body)
	require.NoError(t, err, "the response ends once COMPLETED is recorded")
	assert.Empty(t, rest)
	_ = r.resp.Body.Close()
	again := post(t, srv, "/pay", "k1", "p")
	assert.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
	assert.EqualValues(t, 1, api.runs.Load())
}

// TestStoredKeysHideScope: the scope (an API key, here) appears in no
// stored key, while each tenant keeps its own record.
func TestStoredKeysHideScope(t *testing.T) {
	const secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		h := newMiddleware(t, store, prefix, nil).Handler(newPayments())
		got := serve(h, newRequest(step{keys: key("order-42"), tenant: secret}))
		require.Equal(t, http.StatusCreated, got.status)

		rec, err := store.Get(context.Background(), httpidem.StoreKey(prefix, secret, "order-42"))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State, "the record is under the documented key")
		for _, k := range storedKeys(t, kind, store, prefix) {
			assert.NotContains(t, k, secret[3:], "a stored key holds the scope")
		}
	})
}

// storedKeys lists the keys a test left in its store: from Redis by SCAN,
// from memstore by its size (one record, checked under its expected key).
// KEYS is fine here: the prefix is the test's own, on a test server.
func storedKeys(t *testing.T, kind storeKind, store idempotency.Store, prefix string) []string {
	t.Helper()
	if kind.Name != "redisstore" {
		n, ok := store.(interface{ Len() int })
		require.True(t, ok)
		require.Equal(t, 1, n.Len(), "one record, the one checked above")
		return nil
	}
	c := testserver.RedisClient(t)
	keys, err := c.Keys(context.Background(), prefix+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	return keys
}

// TestCallerGone: a client that gives up while its claim waits on the store
// is counted caller_gone and logged below Error, not store_unavailable,
// which tells an operator that the store fails; a client that waits out
// StoreTimeout is store_unavailable. Nothing runs for either.
func TestCallerGone(t *testing.T) {
	store := adaptertest.PartitionedStore(t)
	api := newPayments()
	obs := newRecordingObserver()
	logger := watermill.NewCaptureLogger()
	served := make(chan struct{}, 1)
	server := func(storeTimeout time.Duration) *httptest.Server {
		m, err := build(config{OnceConfig: idempotency.OnceConfig{Store: store, Observer: obs, StoreTimeout: storeTimeout, Logger: logger}, Config: httpidem.Config{SingleTenant: true}})
		require.NoError(t, err)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.Handler(api).ServeHTTP(w, r)
			served <- struct{}{} // the outcome is counted
		}))
		t.Cleanup(srv.Close)
		return srv
	}

	// The client's deadline ends long before StoreTimeout could.
	srv := server(2 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "gave-up")
	_, err = srv.Client().Do(req)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	<-served
	outcomes, _ := obs.snapshot()
	assert.Equal(t, map[idempotency.Outcome]int{idempotency.OutcomeCallerGone: 1}, outcomes["http"])
	assert.Empty(t, logger.Captured()[watermill.ErrorLogLevel], "no operator needs to hear of it")

	// A client without a deadline waits out StoreTimeout.
	got := post(t, server(200*time.Millisecond), "/pay", "waited", "")
	<-served
	assert.Equal(t, http.StatusServiceUnavailable, got.status)
	outcomes, _ = obs.snapshot()
	assert.Equal(t, map[idempotency.Outcome]int{idempotency.OutcomeCallerGone: 1, idempotency.OutcomeStoreUnavailable: 1},
		outcomes["http"])
	assert.Len(t, logger.Captured()[watermill.ErrorLogLevel], 1, "store_unavailable is logged at Error")
	assert.Zero(t, api.runs.Load())
}

// TestStoreTimeoutBeforeClientDeadline: a request whose claim StoreTimeout
// cut while its client still waited is store_unavailable, also when the
// client's deadline passes while the failed claim is released.
func TestStoreTimeoutBeforeClientDeadline(t *testing.T) {
	store := adaptertest.PartitionedStore(t)
	obs := newRecordingObserver()
	m, err := build(config{OnceConfig: idempotency.OnceConfig{Store: store, Observer: obs, StoreTimeout: time.Second}, Config: httpidem.Config{SingleTenant: true}})
	require.NoError(t, err)
	api := newPayments()
	served := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.Handler(api).ServeHTTP(w, r)
		served <- struct{}{} // the outcome is counted
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond) // after StoreTimeout, before the release ends
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "store-timeout")
	if resp, err := srv.Client().Do(req); err == nil {
		_ = resp.Body.Close()
	}
	<-served
	outcomes, _ := obs.snapshot()
	assert.Equal(t, map[idempotency.Outcome]int{idempotency.OutcomeStoreUnavailable: 1}, outcomes["http"])
	assert.Zero(t, api.runs.Load())
}
