package middleware_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idempotency "github.com/idempotency/watermill-idempotency/middleware"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// onceStores are the stores every outcome of Once.Do is checked on: the
// in-process one and Redis. Each returns a store and a key prefix unique to
// the test.
var onceStores = []struct {
	name string
	open func(t *testing.T) (idempotency.Store, string)
}{
	{"memstore", func(*testing.T) (idempotency.Store, string) { return memstore.New(memstore.Config{}), "once" }},
	{"redis", sharedRedisStore},
}

// TestOnceOutcomes checks what Do promises, on every store: one run per
// key, the value replayed to later callers, failures run again, a busy key
// refused, a panic fails the key, MaxAttempts stops the work, and a lost
// lease cancels the work's context.
func TestOnceOutcomes(t *testing.T) {
	cases := []struct {
		name string
		fn   func(t *testing.T, store idempotency.Store, key string)
	}{
		{"RunsOnceAndReplays", onceRunsOnceAndReplays},
		{"FailureRunsAgain", onceFailureRunsAgain},
		{"BusyKeyIsInProgress", onceBusyKeyIsInProgress},
		{"ConcurrentCallersRunOnce", onceConcurrentCallersRunOnce},
		{"PanicFailsTheKey", oncePanicFailsTheKey},
		{"MaxAttempts", onceMaxAttempts},
		{"LostLeaseCancelsTheWork", onceLostLeaseCancelsTheWork},
	}
	for _, st := range onceStores {
		t.Run(st.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					store, prefix := st.open(t)
					tc.fn(t, store, prefix+":"+tc.name)
				})
			}
		})
	}
}

func newOnce(t *testing.T, cfg idempotency.OnceConfig) (*idempotency.Once, *outcomes) {
	t.Helper()
	obs := newOutcomes()
	cfg.Observer = obs
	o, err := idempotency.NewOnce(cfg, watermill.NopLogger{})
	require.NoError(t, err)
	return o, obs
}

func onceRunsOnceAndReplays(t *testing.T, store idempotency.Store, key string) {
	o, obs := newOnce(t, idempotency.OnceConfig{Store: store})
	var runs atomic.Int32
	work := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("receipt-1"), nil }
	first, err := o.Do(context.Background(), key, work)
	require.NoError(t, err)
	assert.Equal(t, idempotency.Result{Value: []byte("receipt-1"), Attempts: 1, Outcome: idempotency.OutcomeProcessed}, first)
	for range 3 {
		again, err := o.Do(context.Background(), key, work)
		require.NoError(t, err)
		assert.Equal(t, idempotency.Result{Value: []byte("receipt-1"), Replayed: true, Attempts: 1, Outcome: idempotency.OutcomeDuplicate}, again)
	}
	assert.EqualValues(t, 1, runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))
	assert.Equal(t, 3, obs.get(idempotency.OutcomeDuplicate))
}

func onceFailureRunsAgain(t *testing.T, store idempotency.Store, key string) {
	o, obs := newOnce(t, idempotency.OnceConfig{Store: store})
	boom := errors.New("boom")
	_, err := o.Do(context.Background(), key, func(context.Context) ([]byte, error) { return nil, boom })
	require.ErrorIs(t, err, boom, "the work's own error comes back")
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State)

	res, err := o.Do(context.Background(), key, func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	require.NoError(t, err)
	assert.Equal(t, 2, res.Attempts)
	assert.False(t, res.Replayed)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed))
}

func onceBusyKeyIsInProgress(t *testing.T, store idempotency.Store, key string) {
	o, obs := newOnce(t, idempotency.OnceConfig{Store: store})
	release := make(chan struct{})
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := o.Do(context.Background(), key, func(context.Context) ([]byte, error) {
			close(started)
			<-release
			return nil, nil
		})
		done <- err
	}()
	<-started
	_, err := o.Do(context.Background(), key, func(context.Context) ([]byte, error) {
		t.Error("the work ran while another caller held the key")
		return nil, nil
	})
	require.ErrorIs(t, err, idempotency.ErrInProgress)
	close(release)
	require.NoError(t, <-done)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeInProgress))
}

func onceConcurrentCallersRunOnce(t *testing.T, store idempotency.Store, key string) {
	o, _ := newOnce(t, idempotency.OnceConfig{Store: store})
	var runs atomic.Int32
	var wg sync.WaitGroup
	var replays, busy atomic.Int32
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				res, err := o.Do(context.Background(), key, func(context.Context) ([]byte, error) {
					runs.Add(1)
					time.Sleep(20 * time.Millisecond)
					return []byte("v"), nil
				})
				if errors.Is(err, idempotency.ErrInProgress) {
					busy.Add(1)
					time.Sleep(5 * time.Millisecond)
					continue
				}
				assert.NoError(t, err)
				assert.Equal(t, []byte("v"), res.Value)
				if res.Replayed {
					replays.Add(1)
				}
				return
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 1, runs.Load())
	assert.EqualValues(t, 15, replays.Load(), "every other caller got the stored value")
}

func oncePanicFailsTheKey(t *testing.T, store idempotency.Store, key string) {
	o, obs := newOnce(t, idempotency.OnceConfig{Store: store})
	require.PanicsWithValue(t, "boom", func() {
		_, _ = o.Do(context.Background(), key, func(context.Context) ([]byte, error) { panic("boom") })
	})
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed))
}

func onceMaxAttempts(t *testing.T, store idempotency.Store, key string) {
	o, obs := newOnce(t, idempotency.OnceConfig{Store: store, MaxAttempts: 2})
	var runs atomic.Int32
	fail := func(context.Context) ([]byte, error) { runs.Add(1); return nil, errors.New("poison") }
	for range 2 {
		_, err := o.Do(context.Background(), key, fail)
		require.Error(t, err)
		require.NotErrorIs(t, err, idempotency.ErrTooManyAttempts)
	}
	_, err := o.Do(context.Background(), key, fail)
	require.ErrorIs(t, err, idempotency.ErrTooManyAttempts)
	assert.True(t, idempotency.IsPermanent(err))
	assert.EqualValues(t, 2, runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeTooManyAttempts))
}

func onceLostLeaseCancelsTheWork(t *testing.T, store idempotency.Store, key string) {
	o, obs := newOnce(t, idempotency.OnceConfig{Store: store, LeaseTTL: 90 * time.Millisecond})
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := o.Do(context.Background(), key, func(ctx context.Context) ([]byte, error) {
			close(started)
			<-ctx.Done()
			return nil, context.Cause(ctx)
		})
		done <- err
	}()
	<-started
	require.NoError(t, store.Delete(context.Background(), key)) // an operator released the key
	select {
	case err := <-done:
		require.ErrorIs(t, err, idempotency.ErrLeaseLost)
	case <-time.After(5 * time.Second):
		t.Fatal("the work's context was not cancelled after the lease was lost")
	}
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed))
}

// A store that cannot be reached runs nothing and says so.
func TestOnceStoreDown(t *testing.T) {
	o, obs := newOnce(t, idempotency.OnceConfig{Store: downStore(t)})
	_, err := o.Do(context.Background(), "k", func(context.Context) ([]byte, error) {
		t.Error("the work ran without a claim")
		return nil, nil
	})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeStoreUnavailable))
}
