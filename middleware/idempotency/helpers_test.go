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

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// outcomes counts the middleware's outcomes; it is the Observer of the tests.
type outcomes struct {
	mu     sync.Mutex
	counts map[idempotency.Outcome]int
	ops    map[idempotency.Op]int
}

func newOutcomes() *outcomes {
	return &outcomes{counts: map[idempotency.Outcome]int{}, ops: map[idempotency.Op]int{}}
}

func (o *outcomes) Outcome(_ string, outcome idempotency.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[outcome]++
}

func (o *outcomes) StoreLatency(op idempotency.Op, _ time.Duration, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ops[op]++
}

func (o *outcomes) get(outcome idempotency.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[outcome]
}

func (o *outcomes) op(op idempotency.Op) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ops[op]
}

// newIdem builds the middleware with an outcome counter, failing the test on
// a config error.
func newIdem(t *testing.T, cfg idempotency.Config) (*idempotency.Middleware, *outcomes) {
	t.Helper()
	obs := newOutcomes()
	if cfg.Observer == nil {
		cfg.Observer = obs
	}
	if cfg.NackDelay == 0 {
		cfg.NackDelay = -1
	}
	idem, err := idempotency.New(cfg, watermill.NopLogger{})
	require.NoError(t, err)
	return idem, obs
}

// claimFor is a claim by a new owner, as another consumer would make it.
func claimFor(lease time.Duration, fingerprint []byte) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: lease, TTL: time.Hour, Fingerprint: fingerprint}
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
