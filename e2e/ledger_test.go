package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// effectLedger is where the handlers make their effects, the one thing
// that must happen exactly once per key: hashes (HINCRBY per key) in a
// private redis-server, separate from the store, or on a pg- or mysql-
// column after effectsInDatabase, the rows of a table in the store's
// database.
type effectLedger struct {
	ledger *redis.Client
	// fxTable, when set (effectsInDatabase), is the table that holds the
	// effects in place of the ledger: each is made in the handler's
	// transaction, which also writes COMPLETED.
	fxTable string
	effects sync.Map // "hash/key" once the effect is in the ledger
	// wantEffects lists, per ledger hash, the keys whose effect must happen
	// exactly once.
	wantEffects map[string][]string
}

func newEffectLedger(ledger *redis.Client) effectLedger {
	return effectLedger{ledger: ledger, wantEffects: map[string][]string{}}
}

// effectsInDatabase moves the scenario's effects, on a pg- or mysql- column,
// from the ledger to a table of its own in the store's database, each made
// in the handler's transaction together with COMPLETED
// (pgstore.CompleteInTx, mysqlstore.CompleteInTx): the transactional path
// under a real broker's redeliveries. Elsewhere it does nothing.
func (e *env) effectsInDatabase() {
	if !e.b.sqlStore() {
		return
	}
	// No unique key on (hash, key): a double must show as a second row.
	e.fxTable = e.createTable("e2e_fx_", "id bigserial PRIMARY KEY, hash text NOT NULL, key text NOT NULL",
		"id BIGINT AUTO_INCREMENT PRIMARY KEY, hash VARCHAR(255) NOT NULL, `key` VARCHAR(255) NOT NULL")
}

// expectEffects says that each of keys must have its effect in hash once.
func (e *env) expectEffects(hash string, keys []string) {
	e.wantEffects[hash] = append(e.wantEffects[hash], keys...)
}

func (e *env) ledgerKey(hash string) string { return e.id + ":" + hash }

// effect records the side effect of msg's key in the ledger hash. After
// effectsInDatabase it is a row of the effects table instead, see
// effectInTx.
func (e *env) effect(msg *message.Message, hash, key string) error {
	return e.effectOut(msg, hash, key, nil)
}

// effectOut is effect for a handler that returns out: on the transactional
// path, out is stored with COMPLETED, for duplicates to replay.
func (e *env) effectOut(msg *message.Message, hash, key string, out []*message.Message) error {
	if e.fxTable != "" {
		return e.effectInTx(msg, hash, key, out, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.ledger.HIncrBy(ctx, e.ledgerKey(hash), key, 1).Err(); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	e.effects.Store(hash+"/"+key, true)
	return nil
}

// effectInTx inserts the effect's row and writes COMPLETED, with out as the
// stored output, in one transaction, as a handler booking into its own
// database would. With fail set, it fails after the INSERT instead: the
// rollback must take the effect with it.
func (e *env) effectInTx(msg *message.Message, hash, key string, out []*message.Message, fail error) error {
	if e.b.mysql {
		return e.effectInMySQLTx(msg, hash, key, out, fail)
	}
	ctx := msg.Context()
	err := pgx.BeginFunc(ctx, e.pgPool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{e.fxTable}.Sanitize()+" (hash, key) VALUES ($1, $2)", hash, key); err != nil {
			return err
		}
		if fail != nil {
			return fail
		}
		if err := e.pgStore.CompleteInTx(ctx, tx, out...); err != nil {
			return err
		}
		// Marked before the commit: from the commit on, another consumer's
		// duplicate can find the key COMPLETED and be acked, and the mark
		// must already be there. Nothing sees COMPLETED before the commit
		// (the row stays locked), and a commit that fails leaves the key
		// without an effect, which the accounting reports.
		e.effects.Store(hash+"/"+key, true)
		return nil
	})
	if err != nil {
		return fmt.Errorf("effect in PostgreSQL: %w", err)
	}
	return nil
}

// effectInMySQLTx is effectInTx on a mysql- column: the transaction runs at
// READ COMMITTED, as mysqlstore asks.
func (e *env) effectInMySQLTx(msg *message.Message, hash, key string, out []*message.Message, fail error) error {
	ctx := msg.Context()
	err := func() error {
		tx, err := e.myDB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, "INSERT INTO `"+e.fxTable+"` (hash, `key`) VALUES (?, ?)", hash, key); err != nil {
			return err
		}
		if fail != nil {
			return fail
		}
		if err := e.myStore.CompleteInTx(ctx, tx, out...); err != nil {
			return err
		}
		// Marked before the commit, as in effectInTx.
		e.effects.Store(hash+"/"+key, true)
		return tx.Commit()
	}()
	if err != nil {
		return fmt.Errorf("effect in MySQL: %w", err)
	}
	return nil
}

// haveEffects reports whether every one of keys has had its effect in hash,
// as far as this process has seen.
func (e *env) haveEffects(hash string, keys ...string) bool {
	for _, k := range keys {
		if _, ok := e.effects.Load(hash + "/" + k); !ok {
			return false
		}
	}
	return true
}

// hashCount is what one ledger hash holds against what it must.
type hashCount struct {
	hash    string
	missing []string // keys whose effect never happened
	twice   []string // keys whose effect happened more than once, key×n
	got     int      // keys with an effect, wanted or not
	want    int      // keys that must have one
}

// countEffects reads every hash that expectEffects named, and the number of
// effects in them all.
func (e *env) countEffects() (counts []hashCount, total int) {
	e.t.Helper()
	hashes := make([]string, 0, len(e.wantEffects))
	for hash := range e.wantEffects {
		hashes = append(hashes, hash)
	}
	sort.Strings(hashes)
	for _, hash := range hashes {
		keys := e.wantEffects[hash]
		got := e.effectCounts(hash)
		c := hashCount{hash: hash, got: len(got), want: len(keys)}
		for _, k := range keys {
			switch got[k] {
			case "1":
			case "":
				c.missing = append(c.missing, k)
			default:
				c.twice = append(c.twice, k+"×"+got[k])
			}
		}
		for _, v := range got {
			n, _ := strconv.Atoi(v)
			total += n
		}
		counts = append(counts, c)
	}
	return counts, total
}

// effectCounts is, per key, how many effects hash holds: from the ledger,
// or from the effects table after effectsInDatabase.
func (e *env) effectCounts(hash string) map[string]string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if e.fxTable == "" {
		got, err := e.ledger.HGetAll(ctx, e.ledgerKey(hash)).Result()
		require.NoError(e.t, err)
		return got
	}
	if e.b.mysql {
		rows, err := e.myDB.QueryContext(ctx, "SELECT `key`, count(*) FROM `"+e.fxTable+"` WHERE hash = ? GROUP BY `key`", hash)
		require.NoError(e.t, err)
		defer rows.Close()
		got := map[string]string{}
		for rows.Next() {
			var key string
			var n int64
			require.NoError(e.t, rows.Scan(&key, &n))
			got[key] = strconv.FormatInt(n, 10)
		}
		require.NoError(e.t, rows.Err())
		return got
	}
	rows, err := e.pgPool.Query(ctx, "SELECT key, count(*) FROM "+pgx.Identifier{e.fxTable}.Sanitize()+
		" WHERE hash = $1 GROUP BY key", hash)
	require.NoError(e.t, err)
	got := map[string]string{}
	var key string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		got[key] = strconv.FormatInt(n, 10)
		return nil
	})
	require.NoError(e.t, err)
	return got
}
