package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"log"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"

	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// mysqlBench is the MySQL side of a run: a *sql.DB whose round trips are
// counted, the store's table and an effects table for the transactional
// handler, both of this run's own, dropped by close.
type mysqlBench struct {
	db      *sql.DB
	counter *sqlCounter
	table   string // the store's
	effects string // rows booked by the transactional handler
	stores  []*mysqlstore.Store
}

// openMySQL connects to the mysql:// URL with maxConns connections,
// creates the run's tables, and warms the pool up so that no measurement
// pays for dialling.
func openMySQL(url string, maxConns int) *mysqlBench {
	cfg, err := mysqlstore.ParseURL(url)
	if err != nil {
		log.Fatalf("-mysql: %v", err)
	}
	inner, err := mysql.NewConnector(cfg)
	if err != nil {
		log.Fatalf("-mysql: %v", err)
	}
	counter := &sqlCounter{}
	db := sql.OpenDB(countingConnector{inner: inner, c: counter})
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	m := &mysqlBench{db: db, counter: counter,
		table:   "idembench_" + hex.EncodeToString(suffix),
		effects: "idembench_fx_" + hex.EncodeToString(suffix)}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		log.Fatalf("MySQL at %s: %v (set -mysql or MYSQL_URL; an empty -mysql leaves MySQL out)", cfg.Addr, err)
	}
	if err := m.store().Migrate(ctx); err != nil {
		_ = db.Close()
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE `"+m.effects+"` (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) NOT NULL) ENGINE=InnoDB"); err != nil {
		m.close()
		log.Fatal(err)
	}
	conns := make([]*sql.Conn, 0, maxConns)
	for range maxConns {
		c, err := db.Conn(ctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		_ = c.Close()
	}
	return m
}

// store is a mysqlstore on the run's table.
func (m *mysqlBench) store() *mysqlstore.Store {
	s, err := mysqlstore.New(m.db, mysqlstore.Config{Table: m.table})
	if err != nil {
		log.Fatal(err)
	}
	m.stores = append(m.stores, s)
	return s
}

// purge empties the store's table between measurements, so that each
// starts from the same size.
func (m *mysqlBench) purge() {
	for _, t := range []string{m.table, m.effects} {
		if _, err := m.db.ExecContext(context.Background(), "TRUNCATE TABLE `"+t+"`"); err != nil {
			log.Printf("truncate %s: %v", t, err)
		}
	}
}

func (m *mysqlBench) close() {
	for _, s := range m.stores {
		_ = s.Close()
	}
	for _, t := range []string{m.table, m.effects} {
		if _, err := m.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+t+"`"); err != nil {
			log.Printf("drop table %s: %v", t, err)
		}
	}
	_ = m.db.Close()
}

// bookingHandler is a handler that makes its effect in MySQL: a READ
// COMMITTED transaction, an INSERT, CompleteInTx, COMMIT. Its statements
// carry inHandler in their context, so that the counter tells them from the
// middleware's; the store's statement among them carries inStore too.
func (m *mysqlBench) bookingHandler(s *mysqlstore.Store) message.HandlerFunc {
	insert := "INSERT INTO `" + m.effects + "` (k) VALUES (?)"
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := context.WithValue(msg.Context(), inHandler{}, true)
		tx, err := m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, insert, msg.UUID); err != nil {
			return nil, err
		}
		if err := s.CompleteInTx(context.WithValue(ctx, inStore{}, true), tx); err != nil {
			return nil, err
		}
		return nil, tx.Commit()
	}
}

// sqlCounter counts the round trips a *sql.DB makes through
// go-sql-driver/mysql, by wrapping its connections: every statement sent
// (a query, an execution of a prepared statement, START TRANSACTION, SET
// TRANSACTION ISOLATION LEVEL, COMMIT, ROLLBACK) and every statement
// prepared (COM_STMT_PREPARE), each counted in its caller's context;
// prepares also on their own. COM_STMT_CLOSE has no reply and is not
// counted.
type sqlCounter struct {
	outside   atomic.Int64 // sent outside the handler: the store's own
	handler   atomic.Int64 // sent by the handler, its transaction's too
	storeInTx atomic.Int64 // the store's among the handler's
	prepares  atomic.Int64
}

func (c *sqlCounter) sent(ctx context.Context, n int64) {
	switch {
	case ctx.Value(inStore{}) != nil:
		c.storeInTx.Add(n)
		c.handler.Add(n)
	case ctx.Value(inHandler{}) != nil:
		c.handler.Add(n)
	default:
		c.outside.Add(n)
	}
}

func (c *sqlCounter) read() stmtCounts {
	return stmtCounts{c.outside.Load(), c.handler.Load(), c.storeInTx.Load(), c.prepares.Load()}
}

type countingConnector struct {
	inner driver.Connector
	c     *sqlCounter
}

func (k countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := k.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, c: k.c}, nil
}

func (k countingConnector) Driver() driver.Driver { return k.inner.Driver() }

// countingConn is a go-sql-driver connection that counts. It has the
// optional interfaces the driver's connection has, forwarded.
type countingConn struct {
	driver.Conn
	c *sqlCounter
}

var errNotSupported = errors.New("idembench: the wrapped connection lacks the method")

func (cc *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	p, ok := cc.Conn.(driver.ConnPrepareContext)
	if !ok {
		return nil, errNotSupported
	}
	cc.c.prepares.Add(1)
	cc.c.sent(ctx, 1) // a round trip of its caller's too
	st, err := p.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &countingStmt{Stmt: st, ctxStmt: st.(stmtContext), c: cc.c}, nil
}

func (cc *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := cc.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := e.ExecContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		cc.c.sent(ctx, 1)
	}
	return r, err
}

func (cc *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := cc.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := q.QueryContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		cc.c.sent(ctx, 1)
	}
	return r, err
}

func (cc *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	b, ok := cc.Conn.(driver.ConnBeginTx)
	if !ok {
		return nil, errNotSupported
	}
	n := int64(1) // START TRANSACTION
	if sql.IsolationLevel(opts.Isolation) != sql.LevelDefault {
		n++ // SET TRANSACTION ISOLATION LEVEL first
	}
	cc.c.sent(ctx, n)
	tx, err := b.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return countingTx{Tx: tx, ctx: ctx, c: cc.c}, nil
}

func (cc *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := cc.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (cc *countingConn) ResetSession(ctx context.Context) error {
	if r, ok := cc.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (cc *countingConn) IsValid() bool {
	if v, ok := cc.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// countingTx counts COMMIT and ROLLBACK as the statements of the context
// that began the transaction.
type countingTx struct {
	driver.Tx
	ctx context.Context
	c   *sqlCounter
}

func (t countingTx) Commit() error {
	t.c.sent(t.ctx, 1)
	return t.Tx.Commit()
}

func (t countingTx) Rollback() error {
	t.c.sent(t.ctx, 1)
	return t.Tx.Rollback()
}

type stmtContext interface {
	driver.StmtExecContext
	driver.StmtQueryContext
}

// countingStmt counts each execution of a prepared statement.
type countingStmt struct {
	driver.Stmt
	ctxStmt stmtContext
	c       *sqlCounter
}

func (s *countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.c.sent(ctx, 1)
	return s.ctxStmt.ExecContext(ctx, args)
}

func (s *countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.c.sent(ctx, 1)
	return s.ctxStmt.QueryContext(ctx, args)
}

func (s *countingStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

var (
	_ driver.ConnPrepareContext = (*countingConn)(nil)
	_ driver.ExecerContext      = (*countingConn)(nil)
	_ driver.QueryerContext     = (*countingConn)(nil)
	_ driver.ConnBeginTx        = (*countingConn)(nil)
	_ driver.NamedValueChecker  = (*countingConn)(nil)
	_ driver.SessionResetter    = (*countingConn)(nil)
	_ driver.Validator          = (*countingConn)(nil)
	_ stmtContext               = (*countingStmt)(nil)
	_ driver.NamedValueChecker  = (*countingStmt)(nil)
)

// MySQLStats are the round trips to MySQL per message, counted by wrapping
// the driver's connections: every statement sent is one round trip.
type MySQLStats struct {
	// Store round trips per message, outside any handler's transaction:
	// fresh (claim: write and read; complete), duplicate (the claim, which
	// finds it COMPLETED: write and read) and fresh with the completion in
	// the handler's transaction (the claim).
	Fresh     float64 `json:"fresh"`
	Duplicate float64 `json:"duplicate"`
	FreshTx   float64 `json:"fresh_tx"`
	// In the transactional case, round trips of the handler's own
	// transaction per message (SET TRANSACTION ISOLATION LEVEL, START
	// TRANSACTION, INSERT, the store's CompleteInTx, COMMIT), and the
	// store's among them.
	TxHandler float64 `json:"tx_handler"`
	TxStore   float64 `json:"tx_store"`
	// Prepares is how many statements were prepared during the
	// measurements, counted above too: the store prepares each of its
	// statements once per connection, but the handler's INSERT, a query
	// with arguments, is prepared, run and closed each time by
	// go-sql-driver unless the DSN sets interpolateParams.
	Prepares int64 `json:"prepares"`
	// Messages per measurement.
	Messages int `json:"messages"`
}

// runMySQLStats is runPGStats on mysqlstore.
func runMySQLStats(m *mysqlBench, n int) MySQLStats {
	s := m.store()
	idem := newIdempotency(idemConfig{Store: s, KeyPrefix: "idem",
		Scope: func(*message.Message) string { return "orders" }}, true)
	plain, booking := idem.Middleware(noop), idem.Middleware(m.bookingHandler(s))
	for _, h := range []message.HandlerFunc{plain, booking} {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		for range 2 {
			if _, err := h(msg); err != nil {
				log.Fatal(err)
			}
		}
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = watermill.NewUUID()
	}
	st := MySQLStats{Messages: n}
	first := m.counter.read()
	measure := func(h message.HandlerFunc, keys []string) stmtCounts {
		before := m.counter.read()
		for _, k := range keys {
			if _, err := h(message.NewMessage(k, nil)); err != nil {
				log.Fatal(err)
			}
		}
		after := m.counter.read()
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
	st.Prepares = m.counter.read().prepares - first.prepares
	var booked int
	if err := m.db.QueryRowContext(context.Background(), "SELECT count(*) FROM `"+m.effects+"`").Scan(&booked); err != nil {
		log.Fatal(err)
	}
	if booked != n+1 { // the n messages and the warm-up's
		log.Fatalf("the transactional handler booked %d rows, want %d", booked, n+1)
	}
	m.purge()
	return st
}
