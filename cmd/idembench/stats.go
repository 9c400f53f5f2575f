package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// Stats are the counts per message: Redis commands and round trips (a
// go-redis hook on the store's client, on a private redis-server), the
// bytes of a COMPLETED key, and PostgreSQL statements.
type Stats struct {
	Messages int    `json:"messages"` // per cell
	Cost     []Cost `json:"cost"`
	// MemoryUsage is the mean MEMORY USAGE of a COMPLETED key without
	// output, KeyBytes the length of its name.
	MemoryUsage float64  `json:"memory_usage"`
	KeyBytes    int      `json:"key_bytes"`
	PG          *PGStats `json:"pg,omitempty"`
}

// Cost is one cell: a load (fresh; duplicate-nocache, the same keys
// through a middleware without its local cache; duplicate-warm, the same
// keys again through the middleware whose cache holds them) at a
// concurrency, the store with its defaults (auto-pipelining on).
type Cost struct {
	Load        string  `json:"load"`
	Concurrency int     `json:"concurrency"`
	Commands    float64 `json:"commands"`
	RoundTrips  float64 `json:"round_trips"` // a pipeline is one
}

// PGStats are the statements pgstore sends per message, counted by a pgx
// tracer on the pool (each is one round trip), the local cache off:
// fresh, duplicate, and fresh with the completion in the handler's
// transaction (those outside it: the claim).
type PGStats struct {
	Fresh     float64 `json:"fresh"`
	Duplicate float64 `json:"duplicate"`
	FreshTx   float64 `json:"fresh_tx"`
}

// counter is a go-redis hook that counts commands and round trips.
type counter struct{ commands, roundTrips atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.count(cmds); return next(ctx, cmds) }
}

func (c *counter) count(cmds []redis.Cmder) {
	var n int64
	for _, cmd := range cmds {
		if !connectionSetup[cmd.Name()] {
			n++
		}
	}
	if n > 0 {
		c.commands.Add(n)
		c.roundTrips.Add(1)
	}
}

func runStats(o options) Stats {
	st := Stats{Messages: o.statsN}
	c, stop, err := startRedis()
	if err != nil {
		log.Fatalf("stats: %v", err)
	}
	defer stop()
	hook := &counter{}
	c.AddHook(hook)
	store := newStore(c)
	// Keys as a service would have them: idem:orders:<uuid>.
	config := idempotency.Config{KeyPrefix: "idem", Scope: func(*message.Message) string { return "orders" }}
	cached := newMiddleware(idempotency.OnceConfig{Store: store}, config).Middleware(noop)
	uncached := newMiddleware(idempotency.OnceConfig{Store: store, CacheMaxBytes: -1}, config).Middleware(noop)
	// A message through each first: the scripts are loaded.
	send(cached, 1, newKeys(1))
	send(uncached, 1, newKeys(1))
	ctx := context.Background()
	if err := c.FlushAll(ctx).Err(); err != nil {
		log.Fatal(err)
	}

	keys := newKeys(o.statsN)
	send(cached, 1, keys)
	var sum int64
	for _, k := range c.Keys(ctx, "*").Val() {
		n, err := c.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			log.Fatalf("MEMORY USAGE %s: %v", k, err)
		}
		sum, st.KeyBytes = sum+n, len(k)
	}
	st.MemoryUsage = float64(sum) / float64(o.statsN)

	for _, conc := range o.concurrency {
		keys := newKeys(o.statsN)
		for _, x := range []struct {
			load  string
			chain message.HandlerFunc
		}{{"fresh", cached}, {"duplicate-nocache", uncached}, {"", cached}, {"duplicate-warm", cached}} {
			cmds, trips := hook.commands.Load(), hook.roundTrips.Load()
			send(x.chain, conc, keys)
			if x.load != "" { // "": the pass that fills the cache
				n := float64(o.statsN)
				st.Cost = append(st.Cost, Cost{Load: x.load, Concurrency: conc,
					Commands: float64(hook.commands.Load()-cmds) / n, RoundTrips: float64(hook.roundTrips.Load()-trips) / n})
			}
		}
	}
	if o.pgURL != "" {
		st.PG = runPGStats(o)
	}
	return st
}

func noop(*message.Message) ([]*message.Message, error) { return nil, nil }

func newKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = watermill.NewUUID()
	}
	return keys
}

// send passes one message per key through chain, from conc goroutines.
func send(chain message.HandlerFunc, conc int, keys []string) {
	forEach(conc, keys, func(k string) {
		if _, err := chain(message.NewMessage(k, nil)); err != nil {
			log.Fatal(err)
		}
	})
}

// stmtCounter is a pgx tracer that counts the statements sent outside the
// handler's transaction (whose contexts carry inHandler).
type stmtCounter struct{ outside atomic.Int64 }

type inHandler struct{}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if ctx.Value(inHandler{}) == nil {
		c.outside.Add(1)
	}
	return ctx
}

func (*stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// runPGStats sends o.statsN fresh messages through the middleware on
// pgstore, one at a time, the same again as duplicates, then as many fresh
// ones through a handler that books a row and completes in its own
// transaction (BEGIN, INSERT, CompleteInTx, COMMIT), on tables of its own.
func runPGStats(o options) *PGStats {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(o.pgURL)
	if err != nil {
		log.Fatalf("-pg: %v", err)
	}
	tr := &stmtCounter{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		log.Fatalf("PostgreSQL at -pg: %v (an empty -pg leaves it out)", err)
	}
	defer pool.Close()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	table, effects := "idembench_"+hex.EncodeToString(suffix), pgx.Identifier{"idembench_fx_" + hex.EncodeToString(suffix)}.Sanitize()
	defer func() {
		for _, t := range []string{pgx.Identifier{table}.Sanitize(), effects} {
			if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
				log.Printf("drop table %s: %v", t, err)
			}
		}
	}()
	s, err := pgstore.New(pool, pgstore.Config{Table: table})
	if err == nil {
		err = s.Migrate(ctx)
	}
	if err == nil {
		_, err = pool.Exec(ctx, "CREATE TABLE "+effects+" (id bigserial PRIMARY KEY, key text NOT NULL)")
	}
	if err != nil {
		log.Fatal(err)
	}
	idem := newMiddleware(idempotency.OnceConfig{Store: s, CacheMaxBytes: -1}, idempotency.Config{})
	plain := idem.Middleware(noop)
	booking := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := context.WithValue(msg.Context(), inHandler{}, true)
		return nil, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+effects+" (key) VALUES ($1)", msg.UUID); err != nil {
				return err
			}
			return s.CompleteInTx(ctx, tx)
		})
	})
	// A message of each kind first: pgx prepares a statement once per
	// connection, which is not a cost per message.
	send(plain, 1, newKeys(1))
	send(booking, 1, newKeys(1))
	per := func(h message.HandlerFunc, keys []string) float64 {
		before := tr.outside.Load()
		send(h, 1, keys)
		return float64(tr.outside.Load()-before) / float64(len(keys))
	}
	keys := newKeys(o.statsN)
	st := &PGStats{Fresh: per(plain, keys), Duplicate: per(plain, keys), FreshTx: per(booking, newKeys(o.statsN))}
	var booked int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+effects).Scan(&booked); err != nil || booked != o.statsN+1 {
		log.Fatalf("the transactional handler booked %d rows, want %d (%v)", booked, o.statsN+1, err)
	}
	return st
}
