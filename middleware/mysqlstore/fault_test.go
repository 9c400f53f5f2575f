package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// The faults of TestConnectionCuts, each cutting the one connection of a
// consumer (its claims, its transaction and its completion share it) at a
// different point of a key's first delivery.
const (
	cutClaim       = "claim's reply"              // the claim was applied; its answer is lost
	cutEffect      = "after the effect"           // mid-transaction, before the completion
	cutCompletion  = "after the completion"       // mid-transaction, the row locked by it
	cutCommitReply = "the COMMIT's reply"         // the COMMIT was applied; its answer is lost
	cutNone        = "no fault (a plain message)" // for contrast
)

// A consumer reaches MariaDB through a fault proxy; its connection is cut
// (TCP RST) once per key, at one of five points of the key's first delivery,
// and the delivery is repeated, as a broker redelivers a nacked message,
// until it succeeds. Whatever the cut, each key has exactly one effect and
// ends COMPLETED: a cut before the COMMIT rolls the effect back with the
// completion, and one after it leaves both, which the next delivery finds.
func TestConnectionCuts(t *testing.T) {
	direct := testDB(t)
	ctx := context.Background()
	_, table := newTable(t, direct)
	fx := effectsTable(t, direct)

	cfg, err := mysql.ParseDSN(testserver.MySQLDSN())
	require.NoError(t, err)
	proxy := testserver.StartFaultProxy(t, cfg.Addr)
	cfg = cfg.Clone()
	cfg.Addr = proxy.Addr
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, 2*time.Second, 2*time.Second
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(1) // one connection: the cut is the store's and the transaction's
	t.Cleanup(func() { _ = db.Close() })
	s, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: s, LeaseTTL: time.Second, StoreTimeout: 2 * time.Second})
	require.NoError(t, err)

	cuts := []string{cutClaim, cutEffect, cutCompletion, cutCommitReply, cutNone}
	const perCut = 6
	type outcome struct{ deliveries, effects int }
	got := map[string][]outcome{}
	for i := range perCut * len(cuts) {
		cut := cuts[i%len(cuts)]
		key := fmt.Sprintf("order-%02d", i)
		armed := true // the cut applies to the first delivery only
		work := func(ctx context.Context) ([]byte, error) {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				return nil, err
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(fx)+" (k) VALUES (?)", key); err != nil {
				return nil, err
			}
			if armed && cut == cutEffect {
				proxy.ResetAll()
			}
			if err := s.CompleteValueInTx(ctx, tx, []byte("booked "+key)); err != nil {
				return nil, err
			}
			if armed && cut == cutCompletion {
				proxy.ResetAll()
			}
			if armed && cut == cutCommitReply {
				proxy.ResetMidReply()
			}
			return []byte("booked " + key), tx.Commit()
		}
		if cut == cutClaim {
			proxy.ResetMidReply() // the next reply is the claim's
		}
		deliveries := 0
		deadline := time.Now().Add(20 * time.Second)
		for {
			deliveries++
			res, err := once.Do(ctx, key, work)
			armed = false
			if err == nil {
				assert.Equal(t, []byte("booked "+key), res.Value, key)
				break
			}
			require.True(t, time.Now().Before(deadline), "%s (%s): no delivery succeeded within 20 s: %v", key, cut, err)
			if !errors.Is(err, idempotency.ErrInProgress) {
				t.Logf("%s (%s): delivery %d: %v", key, cut, deliveries, err)
			}
			time.Sleep(50 * time.Millisecond) // the broker's redelivery delay
		}
		got[cut] = append(got[cut], outcome{deliveries, effectsOf(t, direct, fx, key)})
		rec, err := s.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State, key)
	}
	for _, cut := range cuts {
		redelivered, effects := 0, 0
		for _, o := range got[cut] {
			assert.Equal(t, 1, o.effects, "cut %s: one effect per key", cut)
			effects += o.effects
			if o.deliveries > 1 {
				redelivered++
			}
		}
		t.Logf("cut %-26s %d keys, %d needed a second delivery, %d effects", cut+":", len(got[cut]), redelivered, effects)
		if cut != cutNone {
			assert.Positive(t, redelivered, "cut %s: no first delivery failed, so the cut missed", cut)
		}
	}
	assert.Equal(t, 2*perCut, proxy.Resets(), "every reply cut landed")
}
