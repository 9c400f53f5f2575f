package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// The session of the handler's transaction is ended by the server
// (pg_terminate_backend from another session) after CompleteInTx, before
// the COMMIT: the COMMIT fails, the server rolls back effect and
// COMPLETED, the row's lock is gone, and the run still holds the key (a
// renewal goes through and no copy runs beside it). The redelivery makes
// the one effect and COMPLETED.
func TestSessionKilledBeforeTheCommit(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	store, _ := newTable(t, pool)
	effects := effectsTable(t, pool)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: 900 * time.Millisecond})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	kill := true
	var key string // as stored: prefix, scope and the message's key
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		mctx := msg.Context()
		tx, err := pool.Begin(mctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(mctx, "INSERT INTO "+pgx.Identifier{effects}.Sanitize()+" (key) VALUES ('k')"); err != nil {
			return nil, err
		}
		if err := store.CompleteInTx(mctx, tx); err != nil {
			return nil, err
		}
		if kill {
			kill = false
			run, _ := storekit.RunFromContext(mctx)
			key = run.Key()
			var pid int
			require.NoError(t, tx.QueryRow(mctx, "SELECT pg_backend_pid()").Scan(&pid))
			var ok bool
			require.NoError(t, pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok))
			require.True(t, ok)
			time.Sleep(time.Second) // past the lease: only renewals keep it
			rec, err := store.Get(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateInProgress, rec.State, "the run kept renewing the rolled-back key")
			res, err := store.Claim(ctx, key, idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Second, TTL: time.Second})
			require.NoError(t, err)
			assert.False(t, res.Acquired, "no copy runs beside the run")
		}
		return nil, tx.Commit(mctx)
	})
	_, err = h(newMessage("k"))
	require.Error(t, err, "the COMMIT of the ended session fails")
	_, err = h(newMessage("k"))
	require.NoError(t, err, "the redelivery")
	assert.Equal(t, 1, effectsOf(t, pool, effects, "k"))
	rec, err := store.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}
