package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// childVar makes the test binary run the program (main) instead of the
// tests: the kill test's consumers are this binary, re-executed, so that a
// SIGKILL hits a real process with the program's own code.
const childVar = "POSTGRES_LEDGER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childVar) != "" {
		main() // exits 1 on an error
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// tables returns a ledger and a store table of the test's own, dropped when
// it ends.
func tables(t *testing.T, pool *pgxpool.Pool) (ledger, store string) {
	ledger, store = testserver.UniqueName("ledger_"), testserver.UniqueName("idem_ledger_")
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{ledger}.Sanitize()+", "+pgx.Identifier{store}.Sanitize())
		assert.NoError(t, err)
	})
	return ledger, store
}

// The demo on gochannel: every payment published twice is booked once, and
// a second run books nothing, every delivery being a duplicate.
func TestPostgresLedgerDemo(t *testing.T) {
	pool := testserver.PostgresPool(t)
	ledger, store := tables(t, pool)
	t.Setenv("BROKER_URL", "gochannel://")
	t.Setenv("PG_URL", testserver.PostgresURL())
	t.Setenv("LEDGER_TABLE", ledger)
	t.Setenv("IDEMPOTENCY_TABLE", store)
	t.Setenv("PAYMENTS", "50")

	for i, want := range []string{"booked=50 duplicates=50", "booked=0 duplicates=100"} {
		var out bytes.Buffer
		require.NoError(t, run(context.Background(), nil, &out), "run %d", i+1)
		assert.Equal(t, want+"\nOK: 50 of 50 payments booked exactly once\n", out.String(), "run %d", i+1)
	}
	assert.Equal(t, 50, rows(t, pool, ledger), "one ledger row per payment")
}

func rows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

// The consumer, a child process on Redis Streams, is SIGKILLed at random
// moments while it books, and restarted under the same consumer name, as a
// container would be. Whatever a kill interrupted (a claim, the insert, the
// completion, the commit, the ack), the ledger ends with exactly one row
// per payment: none doubled, none lost.
func TestPostgresLedgerSurvivesKills(t *testing.T) {
	pool := testserver.PostgresPool(t)
	redisAddr := testserver.RedisAddr(t)
	rdb := testserver.RedisClient(t)
	ledger, store := tables(t, pool)
	topic := testserver.UniqueName("payments-")
	t.Cleanup(func() { assert.NoError(t, rdb.Del(context.Background(), topic).Err()) })

	const payments, kills = 300, 5
	env := append(os.Environ(), childVar+"=1",
		// A dead consumer's unacked messages are claimed after 1 s (not
		// 60 s), above the 500 ms lease, as the README advises.
		"BROKER_URL=redis://"+redisAddr+"/0?max_idle_time=1s&claim_interval=200ms",
		"BROKER_GROUP=ledger",
		"BROKER_CONSUMER=ledger-1",
		"BROKER_NACK_RESEND_SLEEP=50ms",
		"LEASE_TTL=500ms",
		"PG_URL="+testserver.PostgresURL(),
		"PAYMENTS_TOPIC="+topic,
		"LEDGER_TABLE="+ledger,
		"IDEMPOTENCY_TABLE="+store,
		fmt.Sprintf("PAYMENTS=%d", payments),
	)
	child := func(ctx context.Context, mode string) (*exec.Cmd, *bytes.Buffer, *strings.Builder) {
		cmd := exec.CommandContext(ctx, os.Args[0], mode)
		cmd.Env = env
		var stdout bytes.Buffer
		var stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd, &stdout, &stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pub, out, stderr := child(ctx, "publish")
	require.NoError(t, pub.Run(), "stderr:\n%s", tail(stderr.String()))
	require.Equal(t, fmt.Sprintf("published %d payments to %s, each %d times\n", payments, topic, copies), out.String())

	// Each kill comes when the ledger has reached a random count, so that it
	// lands mid-stream, at a random point of a booking.
	marks := make([]int, kills)
	for i := range marks {
		marks[i] = payments/20 + rand.IntN(payments*3/4)
	}
	slices.Sort(marks)
	for i, mark := range marks {
		cmd, _, stderr := child(ctx, "consume")
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var booked int
		for booked = rows(t, pool, ledger); booked < mark; booked = rows(t, pool, ledger) {
			select {
			case err := <-exited:
				t.Fatalf("consumer %d exited before its kill: %v\nstderr:\n%s", i+1, err, tail(stderr.String()))
			case <-time.After(2 * time.Millisecond):
			}
		}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		err := <-exited
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "consumer %d: %v", i+1, err)
		require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal(), "consumer %d died of the kill", i+1)
		t.Logf("kill %d: %d ledger rows", i+1, booked)
	}

	last, out, stderr := child(ctx, "consume")
	require.NoError(t, last.Run(), "stderr:\n%s", tail(stderr.String()))
	assert.Contains(t, out.String(), fmt.Sprintf("OK: %d of %d payments booked exactly once\n", payments, payments))

	// The same check, made here rather than trusted to the program.
	var distinct, total int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(DISTINCT payment_id), count(*) FROM "+pgx.Identifier{ledger}.Sanitize()).
		Scan(&distinct, &total))
	assert.Equal(t, payments, distinct, "every payment booked")
	assert.Equal(t, payments, total, "no payment booked twice")
	var completed int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{store}.Sanitize()+" WHERE state = 'completed'").
		Scan(&completed))
	assert.Equal(t, payments, completed, "every payment's key COMPLETED with its booking")
	t.Logf("%d kills, then %d payments booked in %d ledger rows", kills, distinct, total)
}

func tail(s string) string {
	const n = 3000
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
