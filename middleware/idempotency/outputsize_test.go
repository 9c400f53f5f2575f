package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// bigOutput is a handler output of one message with payload bytes, whose
// UUID is "out-" and the input's requestId.
func bigOutput(payload int) func(*message.Message) []*message.Message {
	return func(msg *message.Message) []*message.Message {
		return []*message.Message{message.NewMessage("out-"+msg.Metadata.Get("requestId"), make([]byte, payload))}
	}
}

// encodedSize is the size of out as COMPLETED stores it: the length of the
// result stored by a middleware whose bound it does not reach.
func encodedSize(t *testing.T, requestID string, out func(*message.Message) []*message.Message) int {
	t.Helper()
	store := memstore.New(memstore.Config{})
	idem, _ := newIdem(t, testConfig{Store: store, MaxOutputSize: 1 << 30})
	msg := newMsg(requestID, "p")
	_, err := idem.Middleware((&counter{outputs: out}).handle)(msg)
	require.NoError(t, err)
	key, err := idem.StoreKey(msg)
	require.NoError(t, err)
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	return len(rec.Result)
}

// TestOutputAtTheBound: an output whose encoding is exactly MaxOutputSize
// bytes is stored and replayed, and counted processed; one byte more is
// not stored, and counted output_not_stored, with ErrOutputNotStored.
func TestOutputAtTheBound(t *testing.T) {
	t.Parallel()
	out := bigOutput(1000)
	size := encodedSize(t, "k", out)
	for _, tc := range []struct {
		max     int
		stored  bool
		outcome idempotency.Outcome
	}{
		{size, true, idempotency.OutcomeProcessed},
		{size + 1, true, idempotency.OutcomeProcessed},
		{size - 1, false, idempotency.OutcomeOutputNotStored},
	} {
		store := memstore.New(memstore.Config{})
		obs := &detailed{outcomes: newOutcomes()}
		idem, _ := newIdem(t, testConfig{Store: store, MaxOutputSize: tc.max, Observer: obs})
		h := &counter{outputs: out}
		first, err := idem.Middleware(h.handle)(newMsg("k", "p"))
		require.NoError(t, err, "max %d: the handler's success is acked", tc.max)
		require.Len(t, first, 1, "max %d: the first run returns its output for the router to publish", tc.max)
		assert.Equal(t, 1, obs.get(tc.outcome), "max %d (output %d bytes)", tc.max, size)

		dup, err := idem.Middleware(h.handle)(newMsg("k", "p"))
		require.NoError(t, err)
		assert.EqualValues(t, 1, h.runs.Load(), "max %d: the handler ran once", tc.max)
		if tc.stored {
			require.Len(t, dup, 1, "max %d: the duplicate republishes the stored output", tc.max)
			assert.Equal(t, "out-k", dup[0].UUID)
			assert.Len(t, dup[0].Payload, 1000)
			assert.NoError(t, obs.lastErr(idempotency.OutcomeProcessed))
		} else {
			assert.Empty(t, dup, "max %d: the duplicate has no output to republish", tc.max)
			err := obs.lastErr(idempotency.OutcomeOutputNotStored)
			assert.ErrorIs(t, err, idempotency.ErrOutputNotStored)
			assert.ErrorContains(t, err, "bytes of output, MaxOutputSize is")
		}
	}
}

// detailed is an Observer that keeps the error of each outcome.
type detailed struct {
	*outcomes
	errs atomic.Value // map[idempotency.Outcome]error, replaced on write
}

func (d *detailed) Outcome(ctx context.Context, o idempotency.OutcomeDetails) {
	d.outcomes.Outcome(ctx, o)
	m, _ := d.errs.Load().(map[idempotency.Outcome]error)
	next := map[idempotency.Outcome]error{o.Outcome: o.Err}
	for k, v := range m {
		if k != o.Outcome {
			next[k] = v
		}
	}
	d.errs.Store(next)
}

func (d *detailed) lastErr(o idempotency.Outcome) error {
	m, _ := d.errs.Load().(map[idempotency.Outcome]error)
	return m[o]
}

// failFirst is a publisher whose first publish fails, as a broker that is
// briefly down would; it records the UUIDs of the messages it published.
type failFirst struct {
	mu        sync.Mutex
	calls     int
	published []string
}

var errPublish = errors.New("publish failed on purpose")

func (p *failFirst) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.calls == 1 {
		return errPublish
	}
	for _, m := range msgs {
		p.published = append(p.published, m.UUID)
	}
	return nil
}

func (p *failFirst) Close() error { return nil }

func (p *failFirst) result() (calls int, published []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, append([]string(nil), p.published...)
}

// TestFailedPublishOfAnOutput: the router publishes a handler's output
// after the middleware stored COMPLETED, and nacks when that publish fails.
// An output within MaxOutputSize was stored, so the redelivery republishes
// it (at least once); an output over MaxOutputSize was not, so the
// redelivery is acked as a duplicate without it, and the output is lost
// (at most once), as documented, counted output_not_stored beforehand.
func TestFailedPublishOfAnOutput(t *testing.T) {
	t.Parallel()
	atBound := encodedSize(t, "order-1", bigOutput(1000))
	for _, tc := range []struct {
		name      string
		payload   int
		max       int
		published bool
	}{
		{"within MaxOutputSize", 100, 1000, true},
		{"over MaxOutputSize", 5000, 1000, false},
		{"exactly MaxOutputSize", 1000, atBound, true},
		{"one byte over MaxOutputSize", 1000, atBound - 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Publish returns once the message is acked: after the nack of
			// the failed publish, the redelivery, and its publish.
			in := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
			t.Cleanup(func() { _ = in.Close() })
			idem, obs := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}), MaxOutputSize: tc.max})
			h := &counter{outputs: bigOutput(tc.payload)}
			pub := &failFirst{}
			startRouter(t, func(r *message.Router) {
				r.AddMiddleware(idem.Middleware)
				r.AddHandler("produce", "in", in, "out", pub, h.handle)
			})
			require.NoError(t, in.Publish("in", newMsg("order-1", "p")))

			calls, published := pub.result()
			assert.EqualValues(t, 1, h.runs.Load(), "the handler ran once")
			assert.Equal(t, 1, obs.get(idempotency.OutcomeDuplicate), "the failed publish nacked, the redelivery found the key COMPLETED")
			if tc.published {
				assert.Equal(t, 2, calls, "the redelivery publishes the stored output again")
				assert.Equal(t, []string{"out-order-1"}, published, "with its UUID")
				assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))
				assert.Equal(t, 0, obs.get(idempotency.OutcomeOutputNotStored))
			} else {
				assert.Equal(t, 1, calls, "the redelivery had nothing to publish")
				assert.Empty(t, published, "an output over MaxOutputSize is lost when its publish fails")
				assert.Equal(t, 0, obs.get(idempotency.OutcomeProcessed))
				assert.Equal(t, 1, obs.get(idempotency.OutcomeOutputNotStored), "the output that was not stored is counted")
			}
		})
	}
}
