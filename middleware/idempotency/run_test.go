package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// A handler that writes COMPLETED itself, as a store's transactional
// completion does inside the handler's transaction, finds its run in its
// context; the middleware then writes nothing more and still returns the
// handler's output, and a duplicate replays the output the handler stored.
func TestRunCompletedInTransaction(t *testing.T) {
	store := memstore.New(nil)
	idem, obs := newIdem(t, testConfig{Store: store})
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		run, ok := storekit.RunFromContext(msg.Context())
		require.True(t, ok, "the handler's context carries its run")
		out := []*message.Message{message.NewMessage("receipt-1", []byte("booked"))}
		// What the store's transaction would write, fenced by the token.
		require.NoError(t, store.Complete(context.Background(), run.Key(), run.Token(), run.Result(out...), run.CompletedTTL()))
		run.CompletedInTransaction()
		return out, nil
	})
	out, err := h(newMsg("tx-1", "p"))
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.Equal(t, 0, obs.op("complete"), "the middleware wrote no second COMPLETED")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))

	dup, err := idem.Middleware((&counter{}).handle)(newMsg("tx-1", "p"))
	require.NoError(t, err)
	require.Len(t, dup, 1)
	assert.Equal(t, "receipt-1", dup[0].UUID, "the duplicate replays what the transaction stored")
	assert.Equal(t, []byte("booked"), []byte(dup[0].Payload))
}

func TestRunFromContextOutsideARun(t *testing.T) {
	_, ok := storekit.RunFromContext(context.Background())
	assert.False(t, ok)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil), CompletedTTL: time.Hour})
	require.NoError(t, err)
	_, err = once.Do(context.Background(), "k", func(ctx context.Context) ([]byte, error) {
		run, ok := storekit.RunFromContext(ctx)
		require.True(t, ok)
		assert.Equal(t, "k", run.Key())
		assert.Equal(t, time.Hour, run.CompletedTTL())
		assert.Equal(t, []byte(nil), run.Result(), "no output, nothing stored")
		return nil, nil
	})
	require.NoError(t, err)
}

// Runs of adapters that store something other than what a transaction
// inside the work knows (the HTTP middleware stores the response) are not
// offered to transactional completion.
func TestRunFromContextOnlyForWatermillAndDo(t *testing.T) {
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil)})
	require.NoError(t, err)
	lease, _, err := once.Claim(context.Background(), "claimed", nil)
	require.NoError(t, err)
	require.NotNil(t, lease)
	_, ok := storekit.RunFromContext(lease.Context())
	assert.False(t, ok, "a lease claimed through Once.Claim")
	lease.Fail()
}

// waitUntil polls cond until it holds or within has passed.
func waitUntil(cond func() bool, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// A transactional completion that did not commit (nothing reached the
// store) leaves the run holding its lease: the renewals go on past the
// completion, another claim is refused, and the handler's success is then
// written by the middleware. Before, the renewals stopped at
// CompletedInTransaction and the middleware wrote nothing.
func TestRunCompletedInTransactionRolledBack(t *testing.T) {
	const lease = 150 * time.Millisecond
	store := memstore.New(nil)
	idem, obs := newIdem(t, testConfig{Store: store, LeaseTTL: lease})
	var refused bool
	out, err := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		run, ok := storekit.RunFromContext(msg.Context())
		require.True(t, ok)
		run.CompletedInTransaction() // its transaction then rolled back
		before := obs.op("renew")
		if !waitUntil(func() bool { return obs.op("renew") >= before+3 }, 20*lease) {
			return nil, errors.New("the renewals stopped at the transactional completion")
		}
		res, err := store.Claim(context.Background(), run.Key(), idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: lease, TTL: time.Minute})
		require.NoError(t, err)
		refused = !res.Acquired
		return []*message.Message{message.NewMessage("receipt-2", []byte("booked"))}, msg.Context().Err()
	})(newMsg("tx-2", "p"))
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.True(t, refused, "the run still holds its key after a lease and more")
	assert.Equal(t, 1, obs.op("complete"), "the middleware wrote COMPLETED")
	rec, err := store.Get(context.Background(), "idem::tx-2")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// A transactional completion that committed ends the lease quietly: the
// next renewal finds the key completed by the run's own token, the renewals
// stop, and the handler's context is not cancelled though it runs past the
// lease.
func TestRunCompletedInTransactionCommitted(t *testing.T) {
	const lease = 150 * time.Millisecond
	store := memstore.New(nil)
	idem, obs := newIdem(t, testConfig{Store: store, LeaseTTL: lease})
	var renewals int
	_, err := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		run, ok := storekit.RunFromContext(msg.Context())
		require.True(t, ok)
		require.NoError(t, store.Complete(context.Background(), run.Key(), run.Token(), run.Result(), run.CompletedTTL()))
		run.CompletedInTransaction()
		if !waitUntil(func() bool { return obs.op("renew") >= 1 }, 20*lease) {
			return nil, errors.New("no renewal after the transactional completion")
		}
		time.Sleep(2 * lease)
		renewals = obs.op("renew")
		return nil, msg.Context().Err()
	})(newMsg("tx-3", "p"))
	require.NoError(t, err, "the committed run's context is not cancelled")
	assert.Equal(t, 1, renewals, "the renewals ended at the one that found the key completed")
	assert.Equal(t, 0, obs.op("complete"))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))
}
