package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// The crash and crash-loop scenarios run consumers in child processes: this
// test binary, re-executed with these variables set beside the BROKER_*
// ones that backends.FromEnv reads. TestMain runs the child that
// E2E_CHILD names instead of the tests.
const (
	childRoleVar  = "E2E_CHILD" // crash or crash-loop: see runChild
	childTopicVar = "E2E_TOPIC" // the topic to consume
	childStoreVar = "E2E_STORE_ADDR"
	// childPGTableVar, when set, makes the child keep its records in this
	// pgstore table on the shared PostgreSQL (PG_URL) instead of in the
	// Redis at E2E_STORE_ADDR: a pg- column.
	childPGTableVar = "E2E_PG_TABLE"
	// childMySQLTableVar, when set, makes the child keep its records in
	// this mysqlstore table on the shared MySQL (MYSQL_DSN): a mysql-
	// column.
	childMySQLTableVar = "E2E_MYSQL_TABLE"
	childPrefixVar     = "E2E_KEY_PREFIX"
	childLedgerVar     = "E2E_LEDGER_ADDR"
	// childLedgerPrefixVar is the prefix of the scenario's ledger hashes,
	// as ledgerKey makes them.
	childLedgerPrefixVar = "E2E_LEDGER_PREFIX"
)

// runChild runs the child consumer that role names until it is killed,
// exits on purpose, or stops on SIGTERM, and returns the exit code.
func runChild(role string) int {
	children := map[string]func(k *childKit) error{"crash": crashChild, "crash-loop": crashLoopChild}
	run, ok := children[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "e2e: no child %q\n", role)
		return 2
	}
	k, err := newChildKit()
	if err == nil {
		err = run(k)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s child: %v\n", role, err)
		return 2
	}
	return 0
}

// childKit is what every child consumer builds from its environment: its
// backend and topic, and the ledger.
type childKit struct {
	b      *backends.Backend
	topic  string
	ledger *redis.Client
}

func newChildKit() (*childKit, error) {
	cfg, err := backends.FromEnv()
	if err != nil {
		return nil, err
	}
	cfg.Kafka.Tune = kafkaTune
	b, err := backends.New(cfg, logger())
	if err != nil {
		return nil, err
	}
	return &childKit{b: b, topic: os.Getenv(childTopicVar),
		ledger: redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: os.Getenv(childLedgerVar)})}, nil
}

func (k *childKit) ledgerKey(hash string) string { return os.Getenv(childLedgerPrefixVar) + ":" + hash }

// idempotency is the child's middleware, configured as the scenario's
// consumers are, with obs and maxAttempts, on the store that its variables
// name: a pgstore on the table E2E_PG_TABLE names, a mysqlstore on the
// table E2E_MYSQL_TABLE names, or a redisstore on E2E_STORE_ADDR.
func (k *childKit) idempotency(maxAttempts int, obs idempotency.Observer) (*idempotency.Middleware, error) {
	var store idempotency.Store
	var err error
	if table := os.Getenv(childPGTableVar); table != "" {
		var pool *pgxpool.Pool
		if pool, err = pgxpool.New(context.Background(), testserver.PostgresURL()); err != nil {
			return nil, err
		}
		store, err = pgstore.New(pool, pgstore.Config{Table: table})
	} else if table := os.Getenv(childMySQLTableVar); table != "" {
		var db *sql.DB
		if db, err = sql.Open("mysql", testserver.MySQLDSN()); err != nil {
			return nil, err
		}
		store, err = mysqlstore.New(db, mysqlstore.Config{Table: table})
	} else {
		store, err = redisstore.New(redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: os.Getenv(childStoreVar)}))
	}
	if err != nil {
		return nil, err
	}
	return newMiddleware(store, os.Getenv(childPrefixVar), lease, obs, maxAttempts)
}

// child is a consumer in a child process, seen from the test.
type child struct {
	cmd  *exec.Cmd
	log  string // the file of its stdout and stderr
	done chan struct{}
	err  error // what Wait returned, once done is closed
}

// startChild starts the child consumer role as the member cfg names, with
// vars, the variables of its role, beside those of its broker, the
// scenario's topic, store and ledger. One still running at the end of the
// test is killed.
func (e *env) startChild(role string, cfg backends.Config, vars ...string) *child {
	e.t.Helper()
	self, err := os.Executable()
	require.NoError(e.t, err)
	c := &child{log: filepath.Join(e.t.TempDir(), "child.log"), done: make(chan struct{})}
	logFile, err := os.Create(c.log)
	require.NoError(e.t, err)
	c.cmd = exec.Command(self, "-test.run=^$")
	c.cmd.Env = slices.Concat(os.Environ(), childEnv(cfg), []string{
		childRoleVar + "=" + role,
		childTopicVar + "=" + e.topic,
		childStoreVar + "=" + e.storeURL,
		childPGTableVar + "=" + e.sqlTableOf(e.b.pg),
		childMySQLTableVar + "=" + e.sqlTableOf(e.b.mysql),
		childPrefixVar + "=" + e.prefix,
		childLedgerVar + "=" + e.ledger.Options().Addr,
		childLedgerPrefixVar + "=" + e.id,
	}, vars)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	if err := c.cmd.Start(); err != nil {
		_ = logFile.Close()
		e.t.Fatalf("start %s child: %v", role, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		_ = logFile.Close()
		close(c.done)
	}()
	e.t.Cleanup(func() { _ = c.kill() })
	return c
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// output is what the child wrote.
func (c *child) output() string {
	out, _ := os.ReadFile(c.log)
	return string(out)
}

// kill kills the child (SIGKILL) and waits for it to end. It is an error
// that it had ended before.
func (c *child) kill() error {
	if c.exited() {
		return fmt.Errorf("the child had exited before it was killed: %v: %s", c.err, c.output())
	}
	if err := c.cmd.Process.Kill(); err != nil {
		return err
	}
	<-c.done
	return nil
}

// awaitExit waits for c to exit, or, once done holds, stops it with
// SIGTERM, and returns how it ended. It fails the test, with status, when
// the budget runs out first.
func (e *env) awaitExit(c *child, done func() bool, status func() string) error {
	e.t.Helper()
	for {
		select {
		case <-c.done:
			return c.err
		case <-time.After(50 * time.Millisecond):
			if e.remaining() <= 0 {
				e.t.Fatalf("%s: not done within the %v budget: %s", e.id, e.budget, status())
			}
			if done() {
				require.NoError(e.t, c.cmd.Process.Signal(syscall.SIGTERM))
				<-c.done
				return c.err
			}
		}
	}
}
