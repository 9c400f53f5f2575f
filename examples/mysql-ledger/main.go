package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"

	"github.com/idempotency/watermill-idempotency/backends"
	_ "github.com/idempotency/watermill-idempotency/backends/all" // every broker; or import only yours
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

const (
	defaultMySQLURL = "mysql://root@127.0.0.1:3306/test"
	copies          = 2 // each payment is published twice: its producer retried
	handlerName     = "book"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mysql-ledger:", err)
		stop()
		os.Exit(1)
	}
}

// payment is a message's payload.
type payment struct {
	ID          string `json:"payment_id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
}

// settings are the program's, from its argument and the environment (see
// the package doc).
type settings struct {
	publish, consume bool
	payments         int
	topic            string
	ledger           string
	storeTable       string
	lease            time.Duration
}

func settingsFrom(args []string) (settings, error) {
	s := settings{
		publish: true, consume: true, payments: 100,
		topic:      envOr("PAYMENTS_TOPIC", "payments"),
		ledger:     envOr("LEDGER_TABLE", "ledger"),
		storeTable: os.Getenv("IDEMPOTENCY_TABLE"),
	}
	switch {
	case len(args) == 0:
	case len(args) == 1 && args[0] == "publish":
		s.consume = false
	case len(args) == 1 && args[0] == "consume":
		s.publish = false
	default:
		return s, fmt.Errorf("usage: mysql-ledger [publish|consume], got %q", args)
	}
	if v := os.Getenv("PAYMENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 9999 {
			return s, fmt.Errorf("PAYMENTS=%q: want a number from 1 to 9999", v)
		}
		s.payments = n
	}
	if v := os.Getenv("LEASE_TTL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return s, fmt.Errorf("LEASE_TTL=%q: want a positive duration such as 40s", v)
		}
		s.lease = d
	}
	return s, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// paymentIDs are the ids of the run's payments, the same in every process,
// so that a restarted consumer knows what it must find in the ledger.
func paymentIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("payment-%04d", i+1)
	}
	return ids
}

func run(ctx context.Context, args []string, w io.Writer) error {
	s, err := settingsFrom(args)
	if err != nil {
		return err
	}

	dbCfg, err := mysqlstore.ParseURL(envOr("MYSQL_URL", defaultMySQLURL))
	if err != nil {
		return fmt.Errorf("MYSQL_URL: %w", err)
	}
	connector, err := mysql.NewConnector(dbCfg)
	if err != nil {
		return fmt.Errorf("MYSQL_URL: %w", err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	store, err := mysqlstore.New(db, mysqlstore.Config{Table: s.storeTable})
	if err != nil {
		return err
	}
	defer store.Close()
	// Safe at every start, from any number of processes; it never alters
	// an existing table.
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if err := createLedger(ctx, db, s.ledger); err != nil {
		return err
	}

	cfg, err := brokerFromEnv("mysql-ledger")
	if err != nil {
		return err
	}
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	b, err := backends.New(cfg, logger)
	if err != nil {
		return err
	}
	defer b.Close()

	if !s.consume {
		if err := publish(b.Publisher, s); err != nil {
			return err
		}
		fmt.Fprintf(w, "published %d payments to %s, each %d times\n", s.payments, s.topic, copies)
		return nil
	}
	return consume(ctx, w, s, db, store, b, logger)
}

// createLedger creates the ledger table unless it exists. payment_id is
// deliberately not UNIQUE: a constraint would turn a double booking into an
// error and hide it; here the idempotency store alone must prevent it, and
// a double would show as a second row.
func createLedger(ctx context.Context, db *sql.DB, table string) error {
	_, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+quote(table)+` (
		entry_id     BIGINT       AUTO_INCREMENT PRIMARY KEY,
		payment_id   VARCHAR(64)  NOT NULL,
		account      VARCHAR(64)  NOT NULL,
		amount_cents BIGINT       NOT NULL,
		booked_at    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		KEY payment_id (payment_id)
	) ENGINE=InnoDB`)
	if err != nil {
		return fmt.Errorf("create ledger %s: %w", table, err)
	}
	return nil
}

func publish(pub message.Publisher, s settings) error {
	for i, id := range paymentIDs(s.payments) {
		payload, err := json.Marshal(payment{ID: id, Account: fmt.Sprintf("acct-%02d", i%10), AmountCents: int64(100 + i*7%9900)})
		if err != nil {
			return err
		}
		for range copies {
			msg := message.NewMessage(watermill.NewUUID(), payload)
			msg.Metadata.Set("requestId", id) // the key: one booking per payment
			if err := pub.Publish(s.topic, msg); err != nil {
				return fmt.Errorf("publish %s: %w", id, err)
			}
		}
	}
	return nil
}

// book is the handler: it writes the ledger row and the payment's COMPLETED
// record in one READ COMMITTED transaction, so that they commit together or
// not at all.
func book(db *sql.DB, store *mysqlstore.Store, ledger string) message.NoPublishHandlerFunc {
	insert := `INSERT INTO ` + quote(ledger) + ` (payment_id, account, amount_cents) VALUES (?, ?, ?)`
	return func(msg *message.Message) error {
		var p payment
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return fmt.Errorf("payment %s: %w", msg.UUID, err)
		}
		ctx := msg.Context() // carries the run: CompleteInTx finds its key and owner token there
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		defer tx.Rollback() // after Commit, a no-op
		if _, err := tx.ExecContext(ctx, insert, p.ID, p.Account, p.AmountCents); err != nil {
			return err
		}
		if err := store.CompleteInTx(ctx, tx); err != nil { // last before COMMIT; a lost lease rolls the booking back
			return err
		}
		return tx.Commit() // its error must reach the middleware
	}
}

func consume(ctx context.Context, w io.Writer, s settings, db *sql.DB, store *mysqlstore.Store, b *backends.Backend, logger watermill.LoggerAdapter) error {
	stats := &outcomes{}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: s.lease, Observer: stats, Logger: logger})
	if err != nil {
		return err
	}
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	router, err := newRouter(logger, idem.Middleware)
	if err != nil {
		return err
	}
	router.AddConsumerHandler(handlerName, s.topic, b.Subscriber, book(db, store, s.ledger))

	ctx, cancel := context.WithCancel(ctx)
	var background sync.WaitGroup
	defer func() {
		cancel()
		background.Wait() // the purge ends before the database closes
	}()
	background.Add(1)
	go func() {
		defer background.Done()
		// Expired records already count as absent, but only a purge frees
		// their rows: now, then every 5 minutes, until ctx ends.
		_ = store.PurgeEvery(ctx, 5*time.Minute, 1000, logger)
	}()
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	}

	if s.publish {
		if err := publish(b.Publisher, s); err != nil {
			return err
		}
	}
	ids := paymentIDs(s.payments)
	done := func() (bool, error) {
		if s.publish && stats.Count(idempotency.OutcomeProcessed, idempotency.OutcomeDuplicate) < s.payments*copies {
			return false, nil // every delivery acked, so that the counts are complete
		}
		var booked int
		err := db.QueryRowContext(ctx, `SELECT count(DISTINCT payment_id) FROM `+quote(s.ledger)+
			` WHERE payment_id BETWEEN ? AND ?`, ids[0], ids[len(ids)-1]).Scan(&booked)
		return booked == len(ids), err
	}
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := done()
		if err != nil {
			return fmt.Errorf("read the ledger: %w", err)
		}
		if ok {
			break
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return errors.New("not every payment was booked within 2 minutes")
		case err := <-routerDone:
			return fmt.Errorf("router stopped: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	cancel()
	if err := <-routerDone; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}

	fmt.Fprintf(w, "booked=%d duplicates=%d\n", stats.Count(idempotency.OutcomeProcessed), stats.Count(idempotency.OutcomeDuplicate))
	return checkLedger(context.WithoutCancel(ctx), w, db, s.ledger, ids)
}

// checkLedger counts the ledger's rows per payment: each must have exactly
// one.
func checkLedger(ctx context.Context, w io.Writer, db *sql.DB, ledger string, ids []string) error {
	var once, doubled int
	err := db.QueryRowContext(ctx, `SELECT COALESCE(SUM(n = 1), 0), COALESCE(SUM(n > 1), 0)
		FROM (SELECT count(*) AS n FROM `+quote(ledger)+` WHERE payment_id BETWEEN ? AND ? GROUP BY payment_id) AS per_payment`,
		ids[0], ids[len(ids)-1]).Scan(&once, &doubled)
	if err != nil {
		return fmt.Errorf("check the ledger: %w", err)
	}
	if once != len(ids) {
		return fmt.Errorf("FAILED: %d of %d payments booked exactly once (%d more than once, %d not at all)",
			once, len(ids), doubled, len(ids)-once-doubled)
	}
	fmt.Fprintf(w, "OK: %d of %d payments booked exactly once\n", once, len(ids))
	return nil
}

// quote returns a table name as a MySQL identifier.
func quote(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}
