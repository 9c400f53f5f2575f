package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/observertest"
)

// The owner protocol (idempotency.Once.Do) on the store.
var onceCases = []struct {
	name string
	fn   func(h *harness)
}{
	{"Once/RunsOnceAndReplays", onceRunsOnceAndReplays},
	{"Once/FailureRunsAgain", onceFailureRunsAgain},
	{"Once/BusyKeyIsInProgress", onceBusyKeyIsInProgress},
	{"Once/ConcurrentCallersRunOnce", onceConcurrentCallersRunOnce},
	{"Once/PanicFailsTheKey", oncePanicFailsTheKey},
	{"Once/MaxAttempts", onceMaxAttempts},
	{"Once/LostLeaseCancelsTheWork", onceLostLeaseCancelsTheWork},
}

// tally counts outcomes; it is the Observer of the Once cases.
type tally struct{ observertest.ContextRecorder }

func (t *tally) get(o idempotency.Outcome) int {
	n := 0
	for _, d := range t.Details() {
		if d.Outcome == o {
			n++
		}
	}
	return n
}

func (h *harness) once(cfg idempotency.OnceConfig) (*idempotency.Once, *tally) {
	h.t.Helper()
	obs := &tally{}
	cfg.Store, cfg.Observer = h.Store, obs
	cfg.Logger = watermill.NopLogger{}
	o, err := idempotency.NewOnce(cfg)
	require.NoError(h.t, err)
	return o, obs
}

func onceRunsOnceAndReplays(h *harness) {
	t, key := h.t, h.key("k")
	o, obs := h.once(idempotency.OnceConfig{})
	var runs atomic.Int32
	work := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("receipt-1"), nil }
	first, err := o.Do(h.ctx, key, work)
	require.NoError(t, err)
	assert.Equal(t, idempotency.Result{Value: []byte("receipt-1"), Outcome: idempotency.OutcomeProcessed}, first)
	assert.Equal(t, 1, h.get(key).Attempts)
	for range 3 {
		again, err := o.Do(h.ctx, key, work)
		require.NoError(t, err)
		assert.Equal(t, idempotency.Result{Value: []byte("receipt-1"), Outcome: idempotency.OutcomeDuplicate}, again)
	}
	assert.Equal(t, 1, h.get(key).Attempts)
	assert.EqualValues(t, 1, runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))
	assert.Equal(t, 3, obs.get(idempotency.OutcomeDuplicate))
}

func onceFailureRunsAgain(h *harness) {
	t, key := h.t, h.key("k")
	o, obs := h.once(idempotency.OnceConfig{})
	boom := errors.New("boom")
	_, err := o.Do(h.ctx, key, func(context.Context) ([]byte, error) { return nil, boom })
	require.ErrorIs(t, err, boom, "the work's own error comes back")
	assert.Equal(t, idempotency.StateFailed, h.get(key).State)

	res, err := o.Do(h.ctx, key, func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	require.NoError(t, err)
	assert.Equal(t, 2, h.get(key).Attempts)
	assert.Equal(t, idempotency.OutcomeProcessed, res.Outcome)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed))
}

func onceBusyKeyIsInProgress(h *harness) {
	t, key := h.t, h.key("k")
	o, obs := h.once(idempotency.OnceConfig{})
	release, started := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := o.Do(h.ctx, key, func(context.Context) ([]byte, error) {
			close(started)
			<-release
			return nil, nil
		})
		done <- err
	}()
	<-started
	_, err := o.Do(h.ctx, key, func(context.Context) ([]byte, error) {
		t.Error("the work ran while another caller held the key")
		return nil, nil
	})
	require.ErrorIs(t, err, idempotency.ErrInProgress)
	close(release)
	require.NoError(t, <-done)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeInProgress))
}

func onceConcurrentCallersRunOnce(h *harness) {
	t, key := h.t, h.key("k")
	o, _ := h.once(idempotency.OnceConfig{})
	var runs, replays atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				res, err := o.Do(h.ctx, key, func(context.Context) ([]byte, error) {
					runs.Add(1)
					time.Sleep(20 * time.Millisecond)
					return []byte("v"), nil
				})
				if errors.Is(err, idempotency.ErrInProgress) {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				assert.NoError(t, err)
				assert.Equal(t, []byte("v"), res.Value)
				if res.Outcome == idempotency.OutcomeDuplicate {
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

func oncePanicFailsTheKey(h *harness) {
	t, key := h.t, h.key("k")
	o, obs := h.once(idempotency.OnceConfig{})
	require.PanicsWithValue(t, "boom", func() {
		_, _ = o.Do(h.ctx, key, func(context.Context) ([]byte, error) { panic("boom") })
	})
	assert.Equal(t, idempotency.StateFailed, h.get(key).State)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed))
}

func onceMaxAttempts(h *harness) {
	t, key := h.t, h.key("k")
	o, obs := h.once(idempotency.OnceConfig{MaxAttempts: 2})
	var runs atomic.Int32
	fail := func(context.Context) ([]byte, error) { runs.Add(1); return nil, errors.New("poison") }
	for range 2 {
		_, err := o.Do(h.ctx, key, fail)
		require.Error(t, err)
		require.NotErrorIs(t, err, idempotency.ErrTooManyAttempts)
	}
	_, err := o.Do(h.ctx, key, fail)
	require.ErrorIs(t, err, idempotency.ErrTooManyAttempts)
	assert.True(t, idempotency.IsPermanent(err))
	assert.EqualValues(t, 2, runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeTooManyAttempts))
}

func onceLostLeaseCancelsTheWork(h *harness) {
	t := h.t
	o, obs := h.once(idempotency.OnceConfig{LeaseTTL: 90 * time.Millisecond})
	var (
		key  string
		done chan error
	)
	for attempt := 1; ; attempt++ {
		key = h.key(fmt.Sprintf("k%d", attempt))
		started := make(chan struct{})
		done = make(chan error, 1)
		go func() {
			_, err := o.Do(h.ctx, key, func(ctx context.Context) ([]byte, error) {
				close(started)
				<-ctx.Done()
				return nil, context.Cause(ctx)
			})
			done <- err
		}()
		select {
		case <-started:
		case err := <-done:
			// A slow claim takes most of so short a lease; Do gives it back.
			require.Less(t, attempt, 5, "the work never started: %v", err)
			continue
		}
		break
	}
	require.NoError(t, h.Store.Delete(h.ctx, key)) // an operator released the key
	select {
	case err := <-done:
		require.ErrorIs(t, err, idempotency.ErrLeaseLost)
	case <-time.After(5 * time.Second):
		t.Fatal("the work's context was not cancelled after the lease was lost")
	}
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed))
}
