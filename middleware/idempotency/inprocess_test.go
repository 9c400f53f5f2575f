package idempotency_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// deadlines records, for each Claim and Complete, whether its context had a
// deadline.
type deadlines struct {
	mu  sync.Mutex
	had []bool
}

func (d *deadlines) record(ctx context.Context) {
	_, ok := ctx.Deadline()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.had = append(d.had, ok)
}

func (d *deadlines) get() []bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]bool(nil), d.had...)
}

// embeddingSpy embeds memstore's store, and so its in-process mark.
type embeddingSpy struct {
	*memstore.Store
	seen *deadlines
}

func (s embeddingSpy) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.seen.record(ctx)
	return s.Store.Claim(ctx, key, req)
}

func (s embeddingSpy) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	s.seen.record(ctx)
	return s.Store.Complete(ctx, key, token, result, ttl)
}

// wrappingSpy keeps memstore's store behind the Store interface: it is not
// marked, and is timed like a network store.
type wrappingSpy struct {
	idempotency.Store
	seen *deadlines
}

func (s wrappingSpy) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.seen.record(ctx)
	return s.Store.Claim(ctx, key, req)
}

func (s wrappingSpy) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	s.seen.record(ctx)
	return s.Store.Complete(ctx, key, token, result, ttl)
}

// TestInProcessStoreHasNoCallTimeout: memstore, which never waits on I/O, is
// called without the StoreTimeout context that bounds every call of any
// other store (saving a timer per call); a wrapper that hides it behind the
// Store interface gets the timeout again.
func TestInProcessStoreHasNoCallTimeout(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		store    func(*deadlines) idempotency.Store
		deadline bool
	}{
		"memstore": {func(d *deadlines) idempotency.Store {
			return embeddingSpy{Store: memstore.New(memstore.Config{}), seen: d}
		}, false},
		"memstore behind an interface": {func(d *deadlines) idempotency.Store {
			return wrappingSpy{Store: memstore.New(memstore.Config{}), seen: d}
		}, true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seen := &deadlines{}
			once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: tc.store(seen)})
			require.NoError(t, err)
			res, err := once.Do(context.Background(), "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
			require.NoError(t, err)
			assert.Equal(t, idempotency.OutcomeProcessed, res.Outcome)
			assert.Equal(t, []bool{tc.deadline, tc.deadline}, seen.get(), "deadlines of the claim and the complete")
		})
	}
}
