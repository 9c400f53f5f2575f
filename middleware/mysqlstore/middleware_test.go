package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// effectsTable creates a table of effects, one row per run of a handler's
// effect (duplicates allowed, so that a double shows), dropped at the end.
func effectsTable(t *testing.T, db *sql.DB) string {
	t.Helper()
	table := uniqueName("mysqlstore_effects_")
	_, err := db.ExecContext(context.Background(), "CREATE TABLE "+quoted(table)+" (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(200) NOT NULL) ENGINE=InnoDB")
	require.NoError(t, err)
	t.Cleanup(func() { dropTable(t, db, table) })
	return table
}

func effectsOf(t *testing.T, db *sql.DB, table, key string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(context.Background(),
		"SELECT count(*) FROM "+quoted(table)+" WHERE k = ?", key).Scan(&n))
	return n
}

// inTx runs f in a READ COMMITTED transaction of db and commits it, or
// rolls it back when f fails.
func inTx(ctx context.Context, db *sql.DB, f func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// observed counts outcomes and Complete calls of a middleware.
type observed struct {
	outcomes  map[idempotency.Outcome]*atomic.Int32
	completes atomic.Int32
}

func newObserved() *observed {
	o := &observed{outcomes: map[idempotency.Outcome]*atomic.Int32{}}
	for _, oc := range []idempotency.Outcome{idempotency.OutcomeProcessed, idempotency.OutcomeDuplicate, idempotency.OutcomeHandlerFailed, idempotency.OutcomeInProgress} {
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
func bookingHandler(db *sql.DB, store *mysqlstore.Store, effects string) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		out := []*message.Message{message.NewMessage("receipt-"+msg.Metadata.Get("requestId"), []byte("booked"))}
		err := inTx(ctx, db, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(effects)+" (k) VALUES (?)", msg.Metadata.Get("requestId")); err != nil {
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
	db := testDB(t)
	store, _ := newTable(t, db)
	effects := effectsTable(t, db)
	obs := newObserved()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: obs})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	h := idem.Middleware(bookingHandler(db, store, effects))

	out, err := h(newMessage("order-1"))
	require.NoError(t, err)
	require.Len(t, out, 1)
	dup, err := h(newMessage("order-1"))
	require.NoError(t, err)
	require.Len(t, dup, 1)
	assert.Equal(t, "receipt-order-1", dup[0].UUID, "the duplicate replays the output committed with the effect")
	assert.Equal(t, 1, effectsOf(t, db, effects, "order-1"))
	assert.EqualValues(t, 0, obs.completes.Load(), "COMPLETED rode in the handler's transaction: no Complete call")
	assert.EqualValues(t, 1, obs.outcomes[idempotency.OutcomeProcessed].Load())
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
	db := testDB(t)
	store, _ := newTable(t, db)
	effects := effectsTable(t, db)
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
			return nil, inTx(ctx, db, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(effects)+" (k) VALUES ('order-9')"); err != nil {
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
	h := fast.Middleware(bookingHandler(db, store, effects))
	require.Eventually(t, func() bool {
		_, err := h(newMessage("order-9"))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	close(taken)
	<-done

	require.ErrorIs(t, slowErr, idempotency.ErrLeaseLost, "the paused owner is fenced off")
	assert.Equal(t, 1, effectsOf(t, db, effects, "order-9"), "its transaction rolled back: one effect in total")
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
	db := testDB(t)
	store, _ := newTable(t, db)
	effects := effectsTable(t, db)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	book := bookingHandler(db, store, effects)
	var second error
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if _, err := book(msg); err != nil {
			return nil, err
		}
		_, second = book(msg) // the retry of a handler that thought its commit failed
		return nil, nil
	})(newMessage("order-7"))
	require.NoError(t, err)
	require.ErrorIs(t, second, mysqlstore.ErrAlreadyCompleted)
	assert.Equal(t, 1, effectsOf(t, db, effects, "order-7"), "one effect: the second transaction rolled back")
}

// Once.Do's work completes in its transaction with its value, which later
// callers get back; a context outside any run is refused.
func TestCompleteValueInTx(t *testing.T) {
	db := testDB(t)
	store, _ := newTable(t, db)
	effects := effectsTable(t, db)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	work := func(ctx context.Context) ([]byte, error) {
		value := []byte("invoice-17")
		return value, inTx(ctx, db, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(effects)+" (k) VALUES ('invoice-17')"); err != nil {
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
	assert.Equal(t, 1, effectsOf(t, db, effects, "invoice-17"))

	tx, err := db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	assert.ErrorIs(t, store.CompleteInTx(context.Background(), tx), mysqlstore.ErrNoRun)
}
