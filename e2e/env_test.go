package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/rediskeys"
)

// Metadata the scenarios put on every message, beside the requestId.
const (
	// metaID names one published message (key#copy), so that every message
	// is known to be acked even when copies share a UUID.
	metaID = "e2e-id"
	// metaEffect names the ledger entry (hash/key) of the effect the message
	// causes, so that an ack can be checked against it.
	metaEffect = "e2e-effect"
	// metaSource is the upstream key of a produced (downstream) message.
	metaSource = "e2e-source"
	// handlerName is the name, and so the idempotency scope, of the handler
	// every consumer runs, in this process or in a child.
	handlerName = "e2e"
)

// runID keeps this run's topics, groups, keys and ledger entries apart
// from any other run on the shared servers.
var runID = strings.ToLower(watermill.NewShortUUID()[:8])

func logger() watermill.LoggerAdapter {
	if os.Getenv("E2E_LOG") != "" {
		return watermill.NewStdLogger(true, false)
	}
	return watermill.NopLogger{}
}

// env is one scenario on one broker. Its parts, each with a file of its
// own: what was published and must end acked (publishing_test.go), the
// consumers (consumers_test.go) and their store (stores_test.go), the
// effects (ledger_test.go), the counters (counters_test.go), and the one
// accounting check that ends every scenario (accounting_test.go).
type env struct {
	t      *testing.T
	b      *broker
	url    string
	name   string
	id     string
	topic  string
	group  string
	prefix string // idempotency KeyPrefix
	// topics are the scenario's topics, deleted at the end.
	topics []string
	start  time.Time
	budget time.Duration
	// note, when set, adds to the summary line.
	note func() string

	publishing
	fleet
	stores
	effectLedger
	counters
}

func newEnv(t *testing.T, b *broker, url, scenario string, ledger *redis.Client, budget time.Duration) *env {
	id := fmt.Sprintf("e2e-%s-%s-%s", runID, b.name, scenario)
	e := &env{
		t: t, b: b, url: url, name: scenario, id: id,
		topic:        id,
		group:        "g-" + id,
		prefix:       id,
		topics:       []string{id},
		start:        time.Now(),
		budget:       budget,
		publishing:   newPublishing(),
		fleet:        fleet{lease: lease},
		effectLedger: newEffectLedger(ledger),
		counters:     counters{obs: newObserver()},
	}
	e.tr = newTracker(e)
	// Registered before e.cleanup, the pool and the publisher close after
	// it has dropped the tables and stopped the consumers.
	e.openStores()
	if b.inProcess {
		e.shared = e.backend("shared")
		e.pub = e.shared.Publisher
	} else {
		e.publishWith("publisher")
	}
	t.Cleanup(e.cleanup)
	return e
}

// cleanup stops what still runs and deletes what the scenario left on the
// shared servers: broker objects, store keys and tables, ledger entries.
func (e *env) cleanup() {
	e.stopConsumers()
	if e.shared != nil {
		_ = e.shared.Close()
	}
	if e.b.cleanup != nil {
		e.b.cleanup(e.t, e.url, e.topics, e.group)
	}
	e.deleteStoreState()
	e.deleteKeys(e.ledger, e.id+":*")
}

// deleteKeys deletes the keys of c that match pattern; what it cannot
// delete is logged, the scenario's verdict being already given.
func (e *env) deleteKeys(c *redis.Client, pattern string) {
	if err := rediskeys.Delete(context.Background(), c, pattern); err != nil {
		e.t.Logf("cleanup: %v", err)
	}
}

// pgScale divides the key counts of the heaviest scenarios on the pg- and
// mysql- columns: every claim there is a statement on the one shared
// PostgreSQL or MySQL, and the columns run beside all the others at once.
// A quarter of the keys still makes hundreds of deliveries race for them.
const pgScale = 4

// size is n keys, or n/pgDiv on a pg- or mysql- column.
func (e *env) size(n, pgDiv int) int {
	if e.b.sqlStore() {
		return n / pgDiv
	}
	return n
}

// remaining is the time left of the scenario's budget.
func (e *env) remaining() time.Duration { return time.Until(e.start.Add(e.budget)) }

// waitFor polls cond until it holds, failing the test when the budget runs
// out.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := e.start.Add(e.budget)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not reached within the %v budget: %s", e.id, e.budget, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
