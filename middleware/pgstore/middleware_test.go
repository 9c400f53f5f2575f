package pgstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// effectsTable creates a table of effects, one row per run of a handler's
// effect (duplicates allowed, so that a double shows), dropped at the end.
func effectsTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := uniqueName("pgstore_effects_")
	_, err := pool.Exec(context.Background(), "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+" (id bigserial PRIMARY KEY, key text NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { dropTable(t, pool, table) })
	return table
}

func effectsOf(t *testing.T, pool *pgxpool.Pool, table, key string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()+" WHERE key = $1", key).Scan(&n))
	return n
}

// observed counts outcomes and Complete calls of a middleware.
type observed struct {
	outcomes  map[idempotency.Outcome]*atomic.Int32
	completes atomic.Int32
}

func newObserved() *observed {
	o := &observed{outcomes: map[idempotency.Outcome]*atomic.Int32{}}
	for _, oc := range []idempotency.Outcome{idempotency.OutcomeProcessed, idempotency.OutcomeDuplicate, idempotency.OutcomeHandlerFailed, idempotency.OutcomeInProgress,
		idempotency.OutcomeOutputNotStored} {
		o.outcomes[oc] = &atomic.Int32{}
	}
	return o
}

func (o *observed) CacheLookup(string, bool) {}

func (o *observed) Outcome(_ context.Context, d idempotency.OutcomeDetails) {
	oc := d.Outcome
	if c, ok := o.outcomes[oc]; ok {
		c.Add(1)
	}
}

func (o *observed) StoreLatency(op string, _ time.Duration, _ error) {
	if op == "complete" {
		o.completes.Add(1)
	}
}

// bookingHandler makes its effect, a row in the effects table, and writes
// COMPLETED in the same transaction, with one output message.
func bookingHandler(pool *pgxpool.Pool, store *pgstore.Store, effects string) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		out := []*message.Message{message.NewMessage("receipt-"+msg.Metadata.Get("requestId"), []byte("booked"))}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{effects}.Sanitize()+" (key) VALUES ($1)", msg.Metadata.Get("requestId")); err != nil {
				return err
			}
			return store.CompleteInTx(ctx, tx, out...)
		})
		return out, err
	}
}

func newMessage(key string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte("pay"))
	m.Metadata.Set("requestId", key)
	return m
}

// The effect and COMPLETED commit in one transaction: the middleware writes
// no second COMPLETED, and a duplicate replays the output stored with it.
func TestMiddlewareCompletesInTheHandlersTransaction(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	effects := effectsTable(t, pool)
	obs := newObserved()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: obs})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	h := idem.Middleware(bookingHandler(pool, store, effects))

	out, err := h(newMessage("order-1"))
	require.NoError(t, err)
	require.Len(t, out, 1)
	dup, err := h(newMessage("order-1"))
	require.NoError(t, err)
	require.Len(t, dup, 1)
	assert.Equal(t, "receipt-order-1", dup[0].UUID, "the duplicate replays the output committed with the effect")
	assert.Equal(t, 1, effectsOf(t, pool, effects, "order-1"))
	assert.EqualValues(t, 0, obs.completes.Load(), "COMPLETED rode in the handler's transaction: no Complete call")
	assert.EqualValues(t, 1, obs.outcomes[idempotency.OutcomeProcessed].Load())
	assert.EqualValues(t, 1, obs.outcomes[idempotency.OutcomeDuplicate].Load())
}

// An output over MaxOutputSize committed with the effect is not stored
// there either (Run.Result leaves it out), and the run counts as
// output_not_stored, as with a Complete after the handler.
func TestOutputNotStoredInTheHandlersTransaction(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	effects := effectsTable(t, pool)
	obs := newObserved()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: obs, MaxOutputSize: 10})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	h := idem.Middleware(bookingHandler(pool, store, effects))

	out, err := h(newMessage("order-1"))
	require.NoError(t, err)
	require.Len(t, out, 1, "the router still gets the output to publish once")
	dup, err := h(newMessage("order-1"))
	require.NoError(t, err)
	assert.Empty(t, dup, "the duplicate has no stored output")
	assert.Equal(t, 1, effectsOf(t, pool, effects, "order-1"))
	assert.EqualValues(t, 0, obs.completes.Load(), "COMPLETED rode in the handler's transaction")
	assert.EqualValues(t, 0, obs.outcomes[idempotency.OutcomeProcessed].Load())
	assert.EqualValues(t, 1, obs.outcomes[idempotency.OutcomeOutputNotStored].Load())
	assert.EqualValues(t, 1, obs.outcomes[idempotency.OutcomeDuplicate].Load())
}

// partitioned is a store whose renewals never reach the database, as for a
// consumer cut off from it: its lease lapses while its handler still runs.
type partitioned struct{ idempotency.Store }

func (partitioned) Renew(context.Context, string, string, time.Duration) error {
	return errors.New("network unreachable")
}

// A handler paused past its lease while another consumer takes the key over
// and books it: the paused one's transaction is fenced off when it tries to
// complete and rolls back, effect included. One effect in total.
func TestLostLeaseRollsTheEffectBack(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	effects := effectsTable(t, pool)
	const runLease = 300 * time.Millisecond

	slowObs := newObserved()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: partitioned{store}, LeaseTTL: runLease, Observer: slowObs})
	require.NoError(t, err)
	slow, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	fastOnce, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: runLease})
	require.NoError(t, err)
	fast, err := idempotency.New(fastOnce, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)

	started, taken := make(chan struct{}), make(chan struct{})
	var slowErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, slowErr = slow.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			// A handler that ignores its context (a long GC pause, a stuck
			// call): it goes on after its lease was given up.
			ctx := context.WithoutCancel(msg.Context())
			return nil, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{effects}.Sanitize()+" (key) VALUES ('order-9')"); err != nil {
					return err
				}
				close(started)
				<-taken // paused until the other consumer has booked the key
				return store.CompleteInTx(ctx, tx)
			})
		})(newMessage("order-9"))
	}()

	// The other consumer's copy is refused while the lease lives, then runs.
	select {
	case <-started:
	case <-done:
		t.Fatalf("the first consumer's handler did not run: %v", slowErr)
	}
	h := fast.Middleware(bookingHandler(pool, store, effects))
	require.Eventually(t, func() bool {
		_, err := h(newMessage("order-9"))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	close(taken)
	<-done

	require.ErrorIs(t, slowErr, idempotency.ErrLeaseLost, "the paused owner is fenced off")
	assert.Equal(t, 1, effectsOf(t, pool, effects, "order-9"), "its transaction rolled back: one effect in total")
	rec, err := store.Get(context.Background(), "idem:"+":order-9")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, 2, rec.Attempts, "the lapsed lease counted, the takeover completed")
	assert.EqualValues(t, 1, slowObs.outcomes[idempotency.OutcomeHandlerFailed].Load())
}

// A second transaction of the same run, as a retry inside the handler after
// a COMMIT whose answer was lost, must not commit a second effect: its
// completion says ErrAlreadyCompleted and it rolls back.
func TestSecondTransactionOfARunRollsBack(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	effects := effectsTable(t, pool)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	book := bookingHandler(pool, store, effects)
	var second error
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if _, err := book(msg); err != nil {
			return nil, err
		}
		_, second = book(msg) // the retry of a handler that thought its commit failed
		return nil, nil
	})(newMessage("order-7"))
	require.NoError(t, err)
	require.ErrorIs(t, second, pgstore.ErrAlreadyCompleted)
	assert.Equal(t, 1, effectsOf(t, pool, effects, "order-7"), "one effect: the second transaction rolled back")
}

// Once.Do's work completes in its transaction with its value, which later
// callers get back; a context outside any run is refused.
func TestCompleteValueInTx(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	effects := effectsTable(t, pool)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	work := func(ctx context.Context) ([]byte, error) {
		value := []byte("invoice-17")
		return value, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{effects}.Sanitize()+" (key) VALUES ('invoice-17')"); err != nil {
				return err
			}
			return store.CompleteValueInTx(ctx, tx, value)
		})
	}
	for range 3 {
		res, err := once.Do(context.Background(), "invoice-17", work)
		require.NoError(t, err)
		assert.Equal(t, []byte("invoice-17"), res.Value)
	}
	assert.Equal(t, 1, effectsOf(t, pool, effects, "invoice-17"))

	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	assert.ErrorIs(t, store.CompleteInTx(context.Background(), tx), pgstore.ErrNoRun)
}

// TestMaxTTLMiddleware: the middleware with a lease and TTLs of
// idempotency.MaxTTL on PostgreSQL: a running key refuses a second copy
// and a completed one is a duplicate, for 100 years.
func TestMaxTTLMiddleware(t *testing.T) {
	store, _ := newTable(t, testPool(t))
	obs := newObserved()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: obs, LeaseTTL: idempotency.MaxTTL, CompletedTTL: idempotency.MaxTTL, FailedTTL: idempotency.MaxTTL})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	var runs atomic.Int32
	release := make(chan struct{})
	handler := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		<-release
		return nil, nil
	})
	newMsg := func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte("p")) }
	first := newMsg()
	first.Metadata.Set("requestId", "forever")
	done := make(chan error, 1)
	go func() { _, err := handler(first); done <- err }()
	require.Eventually(t, func() bool { return runs.Load() == 1 }, 10*time.Second, time.Millisecond)
	rec, err := store.Get(context.Background(), "idem::forever") // prefix:scope:key, no handler name

	require.NoError(t, err)
	assert.Greater(t, time.Until(rec.LeaseExpiresAt), idempotency.MaxTTL-time.Hour, "the lease runs for MaxTTL")

	copyOf := func() *message.Message { m := newMsg(); m.Metadata.Set("requestId", "forever"); return m }
	_, err = handler(copyOf())
	assert.ErrorIs(t, err, idempotency.ErrInProgress, "a live MaxTTL lease is not claimable")
	close(release)
	require.NoError(t, <-done)
	_, err = handler(copyOf())
	require.NoError(t, err)
	assert.EqualValues(t, 1, runs.Load())
	assert.EqualValues(t, 1, obs.outcomes[idempotency.OutcomeProcessed].Load())
	assert.EqualValues(t, 1, obs.outcomes[idempotency.OutcomeDuplicate].Load())
	assert.EqualValues(t, 1, obs.outcomes[idempotency.OutcomeInProgress].Load())
}
