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

// inspector is what idemctl asks of a store, whichever it is: the store
// contract, the listing of its records and the delete that checks a
// record's state first. Only the store packages know the record format.
type inspector interface {
	idempotency.Store
	Records(ctx context.Context, prefix string) iter.Seq2[idempotency.Entry, error]
	DeleteIf(ctx context.Context, key string, states ...idempotency.State) (found idempotency.State, deleted bool, err error)
}

var (
	_ inspector = (*pgstore.Store)(nil)
	_ inspector = (*mysqlstore.Store)(nil)
)

// backend is an opened store: the store, the server's clock (the clock of
// the records' times) and how to close the connection.
type backend struct {
	kind  string
	store inspector
	now   func(ctx context.Context) (time.Time, error)
	close func()
}

// errUsage marks a mistake in the command line.
var errUsage = errors.New("usage")

// open connects to the store named by rawURL and checks that it answers.
func open(ctx context.Context, rawURL, table string) (*backend, error) {
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
		return &backend{kind: "redis", store: store, now: func(ctx context.Context) (time.Time, error) { return client.Time(ctx).Result() },
			close: func() { _ = client.Close() }}, nil
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
		now := func(ctx context.Context) (t time.Time, err error) {
			return t, pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&t)
		}
		return &backend{kind: "postgres", store: store, now: now, close: pool.Close}, nil
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
		now := func(ctx context.Context) (time.Time, error) {
			// The records' clock, UTC_TIMESTAMP(6), read as microseconds so
			// that no DSN setting (parseTime, loc) changes it.
			var us int64
			err := db.QueryRowContext(ctx, `SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`).Scan(&us)
			return time.UnixMicro(us).UTC(), err
		}
		return &backend{kind: "mysql", store: store, now: now, close: func() {
			_ = store.Close()
			_ = db.Close()
		}}, nil
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
