package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// entry is one record found by a walk, whichever the store.
type entry struct {
	Key    string
	Record idempotency.Record
	TTL    time.Duration
	Bytes  int64 // 0 when the store does not report it on a walk
	Err    error
}

// stateCount is one state's line of stats.
type stateCount struct {
	Records   int64 `json:"records"`
	Sampled   int64 `json:"sampled"`
	MeanBytes int64 `json:"mean_bytes"`
}

// backend is what idemctl asks of a store: only methods of the store
// packages, which alone know the record format.
type backend interface {
	kind() string
	now(ctx context.Context) (time.Time, error)
	inspect(ctx context.Context, key string) (rec idempotency.Record, ttl time.Duration, bytes int64, err error)
	walk(ctx context.Context, prefix string) iter.Seq2[entry, error]
	deleteIf(ctx context.Context, key string, states ...idempotency.State) (idempotency.State, bool, error)
	remove(ctx context.Context, key string) error
	// stats counts records by state; exact when the store counts them all
	// itself, else from a walk of at most limit keys, sizing sample per
	// state.
	stats(ctx context.Context, prefix string, limit, sample int, progress func(scanned, matched int)) (counts map[string]stateCount, scanned int, exact, truncated bool, err error)
	close()
}

// errUsage marks a mistake in the command line.
var errUsage = errors.New("usage")

// open connects to the store named by rawURL and checks that it answers.
func open(ctx context.Context, rawURL, table string) (backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("%w: --store %q is not a URL such as redis://localhost:6379/0, postgres://user@host/db or mysql://user@host/db", errUsage, rawURL)
	}
	switch strings.ToLower(u.Scheme) {
	case "redis", "rediss":
		opts, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("%w: --store: %v", errUsage, err)
		}
		opts.ContextTimeoutEnabled = true
		// An operator waiting on a server that is down wants to hear so at
		// once, not after go-redis's five dials per command.
		opts.DialerRetries = 1
		client := redis.NewClient(opts)
		store, err := redisstore.New(client, nil)
		if err != nil {
			_ = client.Close()
			return nil, err
		}
		if err := client.Ping(ctx).Err(); err != nil {
			_ = client.Close()
			return nil, storeDown(fmt.Errorf("redis at %s: %w", opts.Addr, err))
		}
		return &redisBackend{client: client, store: store}, nil
	case "postgres", "postgresql":
		cfg, err := pgxpool.ParseConfig(rawURL)
		if err != nil {
			return nil, fmt.Errorf("%w: --store: %v", errUsage, err)
		}
		cfg.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("%w: --store: %v", errUsage, err)
		}
		store, err := pgstore.New(pool, pgstore.Config{Table: table})
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("%w: --table: %v", errUsage, err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, storeDown(fmt.Errorf("postgres at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err))
		}
		return &pgBackend{pool: pool, store: store}, nil
	case "mysql", "mariadb":
		cfg, err := mysqlstore.ParseURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("%w: --store: %v", errUsage, err)
		}
		if cfg.Timeout == 0 {
			cfg.Timeout = 5 * time.Second // the dial, as for the other stores
		}
		connector, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, fmt.Errorf("%w: --store: %v", errUsage, err)
		}
		db := sql.OpenDB(connector)
		db.SetMaxOpenConns(2)
		store, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
		if err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("%w: --table: %v", errUsage, err)
		}
		if err := db.PingContext(ctx); err != nil {
			_ = db.Close()
			return nil, storeDown(fmt.Errorf("mysql at %s: %w", cfg.Addr, err))
		}
		return &mysqlBackend{db: db, store: store}, nil
	}
	return nil, fmt.Errorf("%w: --store scheme %q: use redis://, rediss://, postgres:// or mysql://", errUsage, u.Scheme)
}

func init() {
	// go-redis logs every failed dial to stderr; idemctl reports the error
	// itself, once.
	redis.SetLogger(quietRedis{})
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

type redisBackend struct {
	client *redis.Client
	store  *redisstore.Store
}

func (b *redisBackend) kind() string { return "redis" }
func (b *redisBackend) close()       { _ = b.client.Close() }

func (b *redisBackend) now(ctx context.Context) (time.Time, error) {
	return b.client.Time(ctx).Result()
}

func (b *redisBackend) inspect(ctx context.Context, key string) (idempotency.Record, time.Duration, int64, error) {
	rec, err := b.store.Get(ctx, key)
	if err != nil || rec.State == idempotency.StateAbsent {
		return rec, 0, 0, err
	}
	ttl := max(b.client.PTTL(ctx, key).Val(), 0)
	n, err := b.client.MemoryUsage(ctx, key, 0).Result()
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	return rec, ttl, n, err
}

func (b *redisBackend) walk(ctx context.Context, prefix string) iter.Seq2[entry, error] {
	return func(yield func(entry, error) bool) {
		for e, err := range b.store.Records(ctx, prefix) {
			if !yield(entry{Key: e.Key, Record: e.Record, TTL: e.TTL, Bytes: e.Bytes, Err: e.Err}, err) {
				return
			}
		}
	}
}

func (b *redisBackend) deleteIf(ctx context.Context, key string, states ...idempotency.State) (idempotency.State, bool, error) {
	return b.store.DeleteIf(ctx, key, states...)
}

func (b *redisBackend) remove(ctx context.Context, key string) error { return b.store.Delete(ctx, key) }

func (b *redisBackend) stats(ctx context.Context, prefix string, limit, sample int, progress func(int, int)) (map[string]stateCount, int, bool, bool, error) {
	counts := map[string]stateCount{}
	sums := map[string]int64{}
	scanned := 0
	for e, err := range b.walk(ctx, prefix) {
		if err != nil {
			return nil, scanned, false, false, err
		}
		if limit > 0 && scanned >= limit {
			return finish(counts, sums), scanned, false, true, nil
		}
		scanned++
		progress(scanned, scanned)
		state := e.Record.State.String()
		switch {
		case e.Err != nil && errors.Is(e.Err, idempotency.ErrCorruptRecord):
			state = pgstore.CountCorrupt
		case e.Err != nil:
			return nil, scanned, false, false, e.Err
		case e.Record.State == idempotency.StateAbsent:
			continue // expired during the walk
		}
		c := counts[state]
		c.Records++
		if c.Sampled < int64(sample) && e.Bytes > 0 {
			c.Sampled++
			sums[state] += e.Bytes
		}
		counts[state] = c
	}
	return finish(counts, sums), scanned, false, false, nil
}

func finish(counts map[string]stateCount, sums map[string]int64) map[string]stateCount {
	for s, c := range counts {
		if c.Sampled > 0 {
			c.MeanBytes = sums[s] / c.Sampled
		}
		counts[s] = c
	}
	return counts
}

type pgBackend struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
}

func (b *pgBackend) kind() string { return "postgres" }
func (b *pgBackend) close()       { b.pool.Close() }

func (b *pgBackend) now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := b.pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&t)
	return t, err
}

func (b *pgBackend) inspect(ctx context.Context, key string) (idempotency.Record, time.Duration, int64, error) {
	return b.store.Inspect(ctx, key)
}

func (b *pgBackend) walk(ctx context.Context, prefix string) iter.Seq2[entry, error] {
	return func(yield func(entry, error) bool) {
		for e, err := range b.store.Records(ctx, prefix, 0) {
			if !yield(entry{Key: e.Key, Record: e.Record, TTL: e.TTL, Bytes: e.Bytes, Err: e.Err}, err) {
				return
			}
		}
	}
}

func (b *pgBackend) deleteIf(ctx context.Context, key string, states ...idempotency.State) (idempotency.State, bool, error) {
	return b.store.DeleteIf(ctx, key, states...)
}

func (b *pgBackend) remove(ctx context.Context, key string) error { return b.store.Delete(ctx, key) }

func (b *pgBackend) stats(ctx context.Context, prefix string, _, _ int, _ func(int, int)) (map[string]stateCount, int, bool, bool, error) {
	counts, err := b.store.Counts(ctx, prefix)
	if err != nil {
		return nil, 0, false, false, err
	}
	out := map[string]stateCount{}
	total := 0
	for s, c := range counts {
		out[s] = stateCount{Records: c.Records, Sampled: c.Records, MeanBytes: c.MeanBytes}
		total += int(c.Records)
	}
	return out, total, true, false, nil
}

type mysqlBackend struct {
	db    *sql.DB
	store *mysqlstore.Store
}

func (b *mysqlBackend) kind() string { return "mysql" }
func (b *mysqlBackend) close() {
	_ = b.store.Close()
	_ = b.db.Close()
}

func (b *mysqlBackend) now(ctx context.Context) (time.Time, error) { return b.store.Now(ctx) }

func (b *mysqlBackend) inspect(ctx context.Context, key string) (idempotency.Record, time.Duration, int64, error) {
	return b.store.Inspect(ctx, key)
}

func (b *mysqlBackend) walk(ctx context.Context, prefix string) iter.Seq2[entry, error] {
	return func(yield func(entry, error) bool) {
		for e, err := range b.store.Records(ctx, prefix, 0) {
			if !yield(entry{Key: e.Key, Record: e.Record, TTL: e.TTL, Bytes: e.Bytes, Err: e.Err}, err) {
				return
			}
		}
	}
}

func (b *mysqlBackend) deleteIf(ctx context.Context, key string, states ...idempotency.State) (idempotency.State, bool, error) {
	return b.store.DeleteIf(ctx, key, states...)
}

func (b *mysqlBackend) remove(ctx context.Context, key string) error { return b.store.Delete(ctx, key) }

func (b *mysqlBackend) stats(ctx context.Context, prefix string, _, _ int, _ func(int, int)) (map[string]stateCount, int, bool, bool, error) {
	counts, err := b.store.Counts(ctx, prefix)
	if err != nil {
		return nil, 0, false, false, err
	}
	out := map[string]stateCount{}
	total := 0
	for s, c := range counts {
		out[s] = stateCount{Records: c.Records, Sampled: c.Records, MeanBytes: c.MeanBytes}
		total += int(c.Records)
	}
	return out, total, true, false, nil
}
