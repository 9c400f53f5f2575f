package e2e

import (
	"context"
	"flag"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// scenario is one row of the table, run unchanged on every broker.
type scenario struct {
	name string
	// budget bounds the whole scenario, start-up included; running out of
	// it fails the test.
	budget time.Duration
	run    func(e *env)
	// na names the brokers the scenario does not apply to, and why; it
	// holds for their pg- and mysql- columns too.
	na map[string]string
	// sqlNA, when set, says why the scenario does not apply with pgstore
	// and mysqlstore.
	sqlNA string
	// inTx: on the pg- and mysql- columns, the handlers make their effects
	// in the store's database and write COMPLETED in the same transaction
	// (pgstore.CompleteInTx, mysqlstore.CompleteInTx), instead of in the
	// Redis ledger.
	inTx bool
}

var scenarios = []scenario{
	{name: "duplicate-storm", budget: 4 * time.Minute, run: duplicateStorm, inTx: true},
	{name: "flaky-handler", budget: 2 * time.Minute, run: flakyHandler, inTx: true},
	{name: "concurrent-copies", budget: 2 * time.Minute, run: concurrentCopies},
	{name: "crash", budget: 2 * time.Minute, run: crash, na: map[string]string{
		"gochannel": "n/a: the killed process would take the in-process channel, and every message in it, " +
			"down with it; nothing is left to redeliver",
	}},
	{name: "store-outage", budget: 2 * time.Minute, run: storeOutage,
		sqlNA: "n/a with pgstore and mysqlstore: the scenario kills and restarts the store's server, a private " +
			"redis-server; the PostgreSQL and MySQL servers are shared and not the test's to kill"},
	{name: "slow-handler", budget: 2 * time.Minute, run: slowHandler},
	{name: "output-replay", budget: 2 * time.Minute, run: outputReplay, inTx: true},
	{name: "crash-loop", budget: 2 * time.Minute, run: crashLoop, na: map[string]string{
		"gochannel": "n/a: each death of the consumer process would take the in-process channel, and the poison " +
			"message in it, down with it; nothing is left to redeliver",
	}},
	{name: "requeue", budget: 2 * time.Minute, run: requeuePoison},
	{name: "broker-restart", budget: 2 * time.Minute, run: brokerRestart, na: brokerRestartNA,
		sqlNA: "n/a with pgstore and mysqlstore: what it checks is the broker's restart, which the redisstore columns " +
			"check on every broker"},
	{name: "stuck-partition", budget: time.Minute, run: stuckPartition, na: map[string]string{
		"redis": "n/a: a Kafka scenario; a stream has no partitions, and a nacked message holds back only the " +
			"consumer it was delivered to",
		"amqp": "n/a: a Kafka scenario; a queue has no partitions, and a nacked message is requeued while the " +
			"group's consumers read on",
		"nats": "n/a: a Kafka scenario; a stream has no partitions, and NATS redelivers a nacked message later " +
			"(NakWithDelay) while the consumer reads on",
		"gochannel": "n/a: a Kafka scenario; gochannel has no partitions, and every consumer receives every message, " +
			"one at a time, so a message that keeps failing holds back all of them",
	}},
}

// columns are the table's columns: every broker with redisstore, then the
// pg- columns with pgstore and the mysql- column with mysqlstore.
var columns = append(append(append([]*broker(nil), brokers...), pgColumns...), mysqlColumns...)

// TestE2E runs every scenario on every broker: TestE2E/<broker>/<scenario>,
// with redisstore as the store, and again on gochannel and NATS with pgstore
// (TestE2E/pg-<broker>/<scenario>) and on NATS with mysqlstore
// (TestE2E/mysql-nats/<scenario>). Columns run in parallel, all at once
// unless -parallel says otherwise (see runEveryColumnAtOnce), the scenarios
// of one column one after another.
func TestE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end scenarios on real servers left out by -short")
	}
	ledgerServer := testserver.StartRedis(t)
	ledger := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: ledgerServer.Addr})
	t.Cleanup(func() { _ = ledger.Close() })
	if err := ledger.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ledger redis-server: %v", err)
	}
	t.Cleanup(func() {
		t.Logf("broker    scenario\n%s", summary.table(order))
	})
	for _, b := range columns {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url := b.start(t)
			for _, s := range scenarios {
				why := s.na[b.kind()]
				if why == "" && b.sqlStore() {
					why = s.sqlNA
				}
				if why != "" {
					// Not a skip: the scenario does not exist for this broker.
					t.Logf("%s/%s does not apply: %s", b.name, s.name, why)
					continue
				}
				t.Run(s.name, func(t *testing.T) {
					e := newEnv(t, b, url, s.name, ledger, s.budget)
					if s.inTx {
						e.effectsInDatabase()
					}
					s.run(e)
				})
			}
		})
	}
}

// order sorts summary lines as the table is laid out: broker, then scenario.
func order(key string) int {
	broker, scen, _ := strings.Cut(key, "/")
	n := 0
	for i, b := range columns {
		if b.name == broker {
			n = i * 100
		}
	}
	for i, s := range scenarios {
		if s.name == scen {
			n += i
		}
	}
	return n
}

func TestMain(m *testing.M) {
	testserver.QuietRedisLogs()
	if role := os.Getenv(childRoleVar); role != "" {
		os.Exit(runChild(role))
	}
	runEveryColumnAtOnce()
	os.Exit(m.Run())
}

// runEveryColumnAtOnce lets every column of TestE2E run at once, unless
// -parallel says how many may: go test's default, GOMAXPROCS, would run two
// at a time on two cores, while a column spends most of its time waiting on
// its broker, its store and its child processes, not on this process's CPU.
func runEveryColumnAtOnce() {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(len(columns), runtime.GOMAXPROCS(0))))
	}
}
