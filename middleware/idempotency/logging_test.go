package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestOutcomesAreLoggedWithTheirFields checks the structured log of each
// delivery: key, handler, outcome and attempts.
func TestOutcomesAreLoggedWithTheirFields(t *testing.T) {
	logger := watermill.NewCaptureLogger()
	idem, err := newMiddleware(testConfig{Store: memstore.New(memstore.Config{}), NackDelay: -1}, logger)
	require.NoError(t, err)
	h := &counter{}
	h.failFor.Store(1)
	msg := newMsg("req-1", "p")
	key, err := idem.StoreKey(msg)
	require.NoError(t, err)
	for range 3 {
		_, _ = idem.Middleware(h.handle)(newMsg("req-1", "p"))
	}

	want := []struct {
		level    watermill.LogLevel
		outcome  idempotency.Outcome
		attempts int
	}{
		{watermill.InfoLogLevel, idempotency.OutcomeHandlerFailed, 1},
		{watermill.DebugLogLevel, idempotency.OutcomeProcessed, 2},
		{watermill.DebugLogLevel, idempotency.OutcomeDuplicate, 2},
	}
	captured := logger.Captured()
	var got []watermill.CapturedMessage
	for _, level := range []watermill.LogLevel{watermill.InfoLogLevel, watermill.DebugLogLevel} {
		for _, m := range captured[level] {
			if m.Msg == "Idempotency outcome" {
				got = append(got, m)
			}
		}
	}
	require.Len(t, got, len(want))
	for i, w := range want {
		f := got[i].Fields
		assert.Equal(t, w.level, got[i].Level, "outcome %s", w.outcome)
		assert.Equal(t, string(w.outcome), f["outcome"])
		assert.Equal(t, key, f["idempotency_key"])
		assert.Equal(t, w.attempts, f["attempts"], "outcome %s", w.outcome)
		assert.Contains(t, f, "handler_name")
		assert.Contains(t, f, "message_uuid")
	}
	assert.ErrorIs(t, got[0].Fields["err"].(error), errHandler, "a failure logs its error")
}

// Watermill's router logs every error a handler chain returns at Error,
// copies of a key in progress elsewhere included: one line per redelivery
// until the holder completes the key or its lease lapses. Through
// RouterLogger those lines are Debug, and every other handler error is
// still an Error. The key is held on a real Redis by a claim of another
// owner, as a consumer that died holds it until its lease lapses.
func TestRouterLoggerLogsInProgressAtDebug(t *testing.T) {
	const copies = 3
	for _, tc := range []struct {
		name string
		wrap func(watermill.LoggerAdapter) watermill.LoggerAdapter
		// inProgressAt is the level of the router's lines for ErrInProgress.
		inProgressAt watermill.LogLevel
	}{
		{"application logger", func(l watermill.LoggerAdapter) watermill.LoggerAdapter { return l }, watermill.ErrorLogLevel},
		{"RouterLogger", idempotency.RouterLogger, watermill.DebugLogLevel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, prefix := sharedRedisStore(t)
			held, err := store.Claim(context.Background(), prefix+":h:busy", claimFor(time.Minute, nil))
			require.NoError(t, err)
			require.True(t, held.Acquired)
			pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = pubSub.Close() })
			idem, obs := newIdem(t, testConfig{Store: store, KeyPrefix: prefix, NackDelay: 5 * time.Millisecond,
				FailedTTL: time.Minute, CompletedTTL: time.Minute})
			capture := &recorder{log: &lines{}}
			var failed atomic.Bool
			stop := startRouterLogging(t, tc.wrap(capture), func(r *message.Router) {
				r.AddMiddleware(idem.Middleware)
				r.AddConsumerHandler("h", "in", pubSub, func(msg *message.Message) error {
					if failed.CompareAndSwap(false, true) {
						return errHandler
					}
					return nil
				})
			})
			require.NoError(t, pubSub.Publish("in", newMsg("busy", "p"), newMsg("fails-once", "p")))
			require.Eventually(t, func() bool {
				return obs.get(idempotency.OutcomeInProgress) >= copies && obs.get(idempotency.OutcomeProcessed) == 1
			}, 10*time.Second, 5*time.Millisecond)
			stop()

			levels := map[watermill.LogLevel]int{} // the router's lines for ErrInProgress, by level
			handlerErrors := 0                     // its Error lines for the failing handler
			for _, m := range capture.log.all() {
				err := m.Err
				if e, ok := m.Fields["err"].(error); ok && err == nil {
					err = e
				}
				switch {
				case m.Msg == "Handler returned error" && errors.Is(err, idempotency.ErrInProgress):
					levels[m.Level]++
				case m.Msg == "Handler returned error" && errors.Is(err, errHandler):
					assert.Equal(t, watermill.ErrorLogLevel, m.Level, "a handler's own error stays an Error")
					handlerErrors++
				}
			}
			names := map[watermill.LogLevel]string{watermill.TraceLogLevel: "trace", watermill.DebugLogLevel: "debug",
				watermill.InfoLogLevel: "info", watermill.ErrorLogLevel: "error"}
			seen := map[string]int{}
			for level, n := range levels {
				seen[names[level]] = n
			}
			assert.GreaterOrEqual(t, levels[tc.inProgressAt], copies, "the router's lines for in-progress copies at %s, by level: %v",
				names[tc.inProgressAt], seen)
			assert.Len(t, levels, 1, "every in-progress line at one level: %v", seen)
			assert.Equal(t, 1, handlerErrors)
		})
	}
}

// recorder is a logger that keeps every line; unlike Watermill's
// CaptureLoggerAdapter, it can be read while a closed router still logs.
type recorder struct {
	log    *lines
	fields watermill.LogFields
}

type lines struct {
	mu sync.Mutex
	l  []watermill.CapturedMessage
}

func (ls *lines) all() []watermill.CapturedMessage {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return append([]watermill.CapturedMessage(nil), ls.l...)
}

func (r *recorder) add(level watermill.LogLevel, msg string, err error, fields watermill.LogFields) {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	r.log.l = append(r.log.l, watermill.CapturedMessage{Level: level, Msg: msg, Err: err, Fields: r.fields.Add(fields)})
}

func (r *recorder) Error(msg string, err error, f watermill.LogFields) {
	r.add(watermill.ErrorLogLevel, msg, err, f)
}
func (r *recorder) Info(msg string, f watermill.LogFields) {
	r.add(watermill.InfoLogLevel, msg, nil, f)
}
func (r *recorder) Debug(msg string, f watermill.LogFields) {
	r.add(watermill.DebugLogLevel, msg, nil, f)
}
func (r *recorder) Trace(msg string, f watermill.LogFields) {
	r.add(watermill.TraceLogLevel, msg, nil, f)
}
func (r *recorder) With(f watermill.LogFields) watermill.LoggerAdapter {
	return &recorder{log: r.log, fields: r.fields.Add(f)}
}
