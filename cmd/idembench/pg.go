package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// pgBench is the PostgreSQL side of a run: a pool whose statements are
// counted, the store's table and an effects table for the transactional
// handler, both of this run's own, dropped by close.
type pgBench struct {
	pool    *pgxpool.Pool
	tracer  *stmtCounter
	table   string // the store's
	effects string // rows booked by the transactional handler
}

// openPG connects to url with a pool of maxConns connections, creates the
// run's tables, and warms the pool up so that no measurement pays for
// dialling.
func openPG(url string, maxConns int) *pgBench {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		log.Fatalf("-pg: %v", err)
	}
	cfg.MaxConns = int32(maxConns)
	tr := &stmtCounter{}
	cfg.ConnConfig.Tracer = tr
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatalf("PostgreSQL at %s: %v (set -pg or PG_URL; an empty -pg leaves PostgreSQL out)", url, err)
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	p := &pgBench{pool: pool, tracer: tr,
		table:   "idembench_" + hex.EncodeToString(suffix),
		effects: "idembench_fx_" + hex.EncodeToString(suffix)}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		log.Fatalf("PostgreSQL at %s: %v (set -pg or PG_URL; an empty -pg leaves PostgreSQL out)", url, err)
	}
	if err := p.store().Migrate(ctx); err != nil {
		pool.Close()
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{p.effects}.Sanitize()+" (id bigserial PRIMARY KEY, key text NOT NULL)"); err != nil {
		p.close()
		log.Fatal(err)
	}
	conns := make([]*pgxpool.Conn, 0, maxConns)
	for range maxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return p
}

// store is a pgstore on the run's table.
func (p *pgBench) store() *pgstore.Store {
	s, err := pgstore.New(p.pool, pgstore.Config{Table: p.table})
	if err != nil {
		log.Fatal(err)
	}
	return s
}

// purge empties the store's table between measurements, so that each
// starts from the same size.
func (p *pgBench) purge() {
	for _, t := range []string{p.table, p.effects} {
		if _, err := p.pool.Exec(context.Background(), "TRUNCATE "+pgx.Identifier{t}.Sanitize()); err != nil {
			log.Printf("truncate %s: %v", t, err)
		}
	}
}

func (p *pgBench) close() {
	for _, t := range []string{p.table, p.effects} {
		if _, err := p.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{t}.Sanitize()); err != nil {
			log.Printf("drop table %s: %v", t, err)
		}
	}
	p.pool.Close()
}

// bookingHandler is a handler that makes its effect in PostgreSQL: BEGIN,
// INSERT a row, CompleteInTx, COMMIT. Its statements carry inHandler in
// their context, so that the counter tells them from the middleware's; the
// store's statement among them carries inStore too.
func (p *pgBench) bookingHandler(s *pgstore.Store) message.HandlerFunc {
	insert := "INSERT INTO " + pgx.Identifier{p.effects}.Sanitize() + " (key) VALUES ($1)"
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := context.WithValue(msg.Context(), inHandler{}, true)
		return nil, pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insert, msg.UUID); err != nil {
				return err
			}
			return s.CompleteInTx(context.WithValue(ctx, inStore{}, true), tx)
		})
	}
}

// inHandler and inStore mark the contexts of the statements the handler
// sends, and of the store's statement among them.
type (
	inHandler struct{}
	inStore   struct{}
)

// stmtCounter is a pgx tracer that counts the statements the pool sends
// (every Query, QueryRow and Exec: one round trip each) and the statements
// it prepares (one more round trip, once per statement and connection).
type stmtCounter struct {
	outside   atomic.Int64 // statements sent outside the handler: the store's own
	handler   atomic.Int64 // statements the handler sent, BEGIN and COMMIT included
	storeInTx atomic.Int64 // the store's statements among the handler's
	prepares  atomic.Int64
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	switch {
	case ctx.Value(inStore{}) != nil:
		c.storeInTx.Add(1)
		c.handler.Add(1)
	case ctx.Value(inHandler{}) != nil:
		c.handler.Add(1)
	default:
		c.outside.Add(1)
	}
	return ctx
}

func (*stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *stmtCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}

func (c *stmtCounter) TracePrepareEnd(_ context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	if !d.AlreadyPrepared {
		c.prepares.Add(1)
	}
}

type stmtCounts struct{ outside, handler, storeInTx, prepares int64 }

func (c *stmtCounter) read() stmtCounts {
	return stmtCounts{c.outside.Load(), c.handler.Load(), c.storeInTx.Load(), c.prepares.Load()}
}

// PGStats are the round trips to PostgreSQL per message, counted by a pgx
// tracer on the pool: every statement sent is one round trip.
type PGStats struct {
	// Store statements per message, outside any handler's transaction:
	// fresh (claim + complete), duplicate (the claim, which finds it
	// COMPLETED) and fresh with the completion in the handler's
	// transaction (the claim).
	Fresh     float64 `json:"fresh"`
	Duplicate float64 `json:"duplicate"`
	FreshTx   float64 `json:"fresh_tx"`
	// In the transactional case, statements of the handler's own
	// transaction per message (BEGIN, INSERT, the store's CompleteInTx,
	// COMMIT), and the store's among them.
	TxHandler float64 `json:"tx_handler"`
	TxStore   float64 `json:"tx_store"`
	// Prepares is how many statements were prepared during the
	// measurements (pgx prepares each once per connection; 0 once warm).
	Prepares int64 `json:"prepares"`
	// Messages per measurement.
	Messages int `json:"messages"`
}

// runPGStats sends n fresh messages through the middleware on pgstore with
// a handler that does nothing, then the same n again as duplicates, then n
// fresh ones through the transactional handler, one at a time, and counts
// the statements of each. The middleware's local cache is off, so that
// every duplicate's claim reaches the store.
func runPGStats(p *pgBench, n int) PGStats {
	s := p.store()
	// The local cache off: the duplicate's figure is the store's own cost.
	idem := newIdempotency(idemConfig{Store: s, KeyPrefix: "idem",
		Scope: func(*message.Message) string { return "orders" }}, true)
	plain, booking := idem.Middleware(noop), idem.Middleware(p.bookingHandler(s))
	// A message of each kind first: pgx prepares a statement the first time
	// a connection sends it, which is not a per-message cost.
	for _, h := range []message.HandlerFunc{plain, booking} {
		m := message.NewMessage(watermill.NewUUID(), nil)
		for range 2 {
			if _, err := h(m); err != nil {
				log.Fatal(err)
			}
		}
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = watermill.NewUUID()
	}
	st := PGStats{Messages: n}
	first := p.tracer.read()
	measure := func(h message.HandlerFunc, keys []string) stmtCounts {
		before := p.tracer.read()
		for _, k := range keys {
			if _, err := h(message.NewMessage(k, nil)); err != nil {
				log.Fatal(err)
			}
		}
		after := p.tracer.read()
		return stmtCounts{after.outside - before.outside, after.handler - before.handler,
			after.storeInTx - before.storeInTx, after.prepares - before.prepares}
	}
	per := func(x int64) float64 { return float64(x) / float64(n) }
	st.Fresh = per(measure(plain, keys).outside)
	st.Duplicate = per(measure(plain, keys).outside)
	txKeys := make([]string, n)
	for i := range txKeys {
		txKeys[i] = watermill.NewUUID()
	}
	tx := measure(booking, txKeys)
	st.FreshTx, st.TxHandler, st.TxStore = per(tx.outside), per(tx.handler), per(tx.storeInTx)
	st.Prepares = p.tracer.read().prepares - first.prepares
	var booked int
	if err := p.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{p.effects}.Sanitize()).Scan(&booked); err != nil {
		log.Fatal(err)
	}
	if booked != n+1 { // the n messages and the warm-up's
		log.Fatalf("the transactional handler booked %d rows, want %d", booked, n+1)
	}
	p.purge()
	return st
}
