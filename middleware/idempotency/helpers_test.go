package idempotency_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// outcomes counts the middleware's outcomes; it is the Observer of the tests.
type outcomes struct {
	mu     sync.Mutex
	counts map[idempotency.Outcome]int
	ops    map[string]int
}

func newOutcomes() *outcomes {
	return &outcomes{counts: map[idempotency.Outcome]int{}, ops: map[string]int{}}
}

func (o *outcomes) Outcome(_ context.Context, d idempotency.OutcomeDetails) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[d.Outcome]++
}

func (o *outcomes) CacheLookup(string, bool) {}

func (o *outcomes) StoreLatency(op string, _ time.Duration, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ops[op]++
}

func (o *outcomes) get(outcome idempotency.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[outcome]
}

func (o *outcomes) op(op string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ops[op]
}

// testConfig is what a test sets: the Once's settings and the
// middleware's, in one literal.
type testConfig struct {
	Store         idempotency.Store
	Observer      idempotency.Observer
	LeaseTTL      time.Duration
	CompletedTTL  time.Duration
	FailedTTL     time.Duration
	StoreTimeout  time.Duration
	MaxAttempts   int
	MaxOutputSize int
	CacheMaxBytes int
	FailOpen      bool
	// CacheTTL, when set, bounds the cache's entries (NewOnceWithCacheTTL).
	CacheTTL time.Duration

	KeyFunc             func(msg *message.Message) (string, error)
	Scope               func(msg *message.Message) string
	KeyPrefix           string
	NackDelay           time.Duration
	CheckPayload        bool
	DisableOutputReplay bool
}

// newMiddleware builds the Once of c, then the middleware on it.
func newMiddleware(c testConfig, logger watermill.LoggerAdapter) (*idempotency.Middleware, error) {
	oc := idempotency.OnceConfig{Store: c.Store, Logger: logger, Observer: c.Observer,
		LeaseTTL: c.LeaseTTL, CompletedTTL: c.CompletedTTL, FailedTTL: c.FailedTTL, StoreTimeout: c.StoreTimeout,
		MaxAttempts: c.MaxAttempts, MaxOutputSize: c.MaxOutputSize, CacheMaxBytes: c.CacheMaxBytes, FailOpen: c.FailOpen}
	newOnce := idempotency.NewOnce
	if c.CacheTTL != 0 {
		newOnce = func(oc idempotency.OnceConfig) (*idempotency.Once, error) {
			return idempotency.NewOnceWithCacheTTL(oc, c.CacheTTL)
		}
	}
	once, err := newOnce(oc)
	if err != nil {
		return nil, err
	}
	return idempotency.New(once, &idempotency.Config{KeyFunc: c.KeyFunc, Scope: c.Scope, KeyPrefix: c.KeyPrefix,
		NackDelay: c.NackDelay, CheckPayload: c.CheckPayload, DisableOutputReplay: c.DisableOutputReplay})
}

// newIdem builds the middleware with an outcome counter, failing the test on
// a config error.
func newIdem(t *testing.T, cfg testConfig) (*idempotency.Middleware, *outcomes) {
	t.Helper()
	obs := newOutcomes()
	if cfg.Observer == nil {
		cfg.Observer = obs
	}
	if cfg.NackDelay == 0 {
		cfg.NackDelay = -1
	}
	idem, err := newMiddleware(cfg, watermill.NopLogger{})
	require.NoError(t, err)
	return idem, obs
}

// claimFor is a claim by a new owner, as another consumer would make it.
func claimFor(lease time.Duration, fingerprint []byte) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: lease, TTL: time.Hour, Fingerprint: fingerprint}
}

// newMsg returns a message with a fresh UUID and the given requestId.
func newMsg(requestID, payload string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if requestID != "" {
		m.Metadata.Set("requestId", requestID)
	}
	return m
}

// counter is a handler that counts its runs and can fail or block.
type counter struct {
	runs    atomic.Int32
	failFor atomic.Int32 // fail this many runs first
	block   chan struct{}
	outputs func(msg *message.Message) []*message.Message
}

var errHandler = errors.New("handler failed on purpose")

func (c *counter) handle(msg *message.Message) ([]*message.Message, error) {
	c.runs.Add(1)
	if c.failFor.Add(-1) >= 0 {
		return nil, errHandler
	}
	if c.block != nil {
		select {
		case <-c.block:
		case <-msg.Context().Done():
			return nil, context.Cause(msg.Context())
		}
	}
	if c.outputs != nil {
		return c.outputs(msg), nil
	}
	return nil, nil
}

func TestMain(m *testing.M) {
	testserver.QuietRedisLogs()
	os.Exit(m.Run())
}

// Validate returns the error newMiddleware reports for c: every problem of
// the Once's settings, then the middleware's.
func (c testConfig) Validate() error {
	_, err := newMiddleware(c, nil)
	return err
}

// validate returns the error NewOnce reports for c.
func validate(c idempotency.OnceConfig) error {
	_, err := idempotency.NewOnce(c)
	return err
}
