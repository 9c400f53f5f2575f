package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
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
	// every consumer runs, in this process or in the crash child.
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

// env is one scenario on one broker: its topics, group, consumers, store,
// ledger entries and counters.
type env struct {
	t      *testing.T
	b      *broker
	url    string
	name   string
	id     string
	topic  string
	group  string
	prefix string // idempotency KeyPrefix
	start  time.Time
	budget time.Duration

	ledger   *redis.Client // a private redis-server, separate from the store
	storeURL string        // the shared Redis the store lives in
	// newStore builds the store of one consumer; by default a redisstore
	// with its own client of the shared Redis, on a pg- column the
	// scenario's pgStore.
	newStore func() idempotency.Store
	// On a pg- column: the pool of the shared PostgreSQL, the store on a
	// table of the scenario's own (pgTable), and the tables to drop at the
	// end. Nil and empty otherwise.
	pgPool   *pgxpool.Pool
	pgStore  *pgstore.Store
	pgTable  string
	pgTables []string
	// fxTable, when set (effectsInPostgres), is the PostgreSQL table that
	// holds the effects in place of the ledger: each is made in the
	// handler's transaction, which also writes COMPLETED.
	fxTable string
	// lease is the consumers' LeaseTTL; by default the package's lease.
	lease time.Duration
	// configure, when set, adjusts the backends configuration of every
	// member built after it is set.
	configure func(cfg *backends.Config)

	pub       message.Publisher
	shared    *backends.Backend // gochannel: the one instance every consumer shares
	consumers []*consumer
	// fanout is how many consumers receive each published message: 1 with
	// consumer groups, every consumer on gochannel, which has none.
	fanout atomic.Int64
	topics []string

	obs     *observer
	tr      *tracker
	effects sync.Map // "hash/key" once the effect is in the ledger
	runs    atomic.Int64
	// wantEffects lists, per ledger hash, the keys whose effect must happen
	// exactly once.
	wantEffects map[string][]string

	mu sync.Mutex
	// groups are the messages that must end acked: at least one message of
	// each group, by metaID. A group is one message, except on a broker
	// that drops repeated UUIDs: there the copies sharing a UUID form one
	// group, since which of them the broker keeps depends on which
	// concurrent publish reached it first.
	groups    map[string][]string
	expected  map[string]bool // metaID of every published or produced message
	published int
	pubWG     sync.WaitGroup
	pubErr    atomic.Value

	// Filled in by scenarios for the summary line.
	publishFailed atomic.Int64 // injected publish failures (output-replay)
	// note, when set, adds to the summary line.
	note func() string
}

func newEnv(t *testing.T, b *broker, url, scenario string, ledger *redis.Client, budget time.Duration) *env {
	id := fmt.Sprintf("e2e-%s-%s-%s", runID, b.name, scenario)
	e := &env{
		t: t, b: b, url: url, name: scenario, id: id,
		topic:       id,
		group:       "g-" + id,
		prefix:      id,
		start:       time.Now(),
		budget:      budget,
		ledger:      ledger,
		lease:       lease,
		storeURL:    testserver.RedisAddr(t),
		obs:         newObserver(),
		wantEffects: map[string][]string{},
		groups:      map[string][]string{},
		expected:    map[string]bool{},
	}
	e.tr = newTracker(e)
	e.topics = []string{e.topic}
	e.newStore = func() idempotency.Store {
		c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: e.storeURL})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(c)
		require.NoError(t, err)
		return s
	}
	if b.pg {
		// Registered before e.cleanup, the pool closes after it has dropped
		// the tables.
		e.pgPool = testserver.PostgresPool(t)
		e.pgTable = testserver.UniqueName("e2e_idem_")
		e.pgTables = append(e.pgTables, e.pgTable)
		s, err := pgstore.New(e.pgPool, pgstore.Config{Table: e.pgTable})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, s.Migrate(ctx))
		e.pgStore = s
		// One store for every consumer: it holds no state but the pool.
		e.newStore = func() idempotency.Store { return s }
	}
	if b.inProcess {
		e.shared = e.backend("shared")
		e.pub = e.shared.Publisher
	} else {
		pb := e.backend("publisher")
		e.pub = pb.Publisher
		t.Cleanup(func() { _ = pb.Close() })
	}
	t.Cleanup(e.cleanup)
	return e
}

// cleanup stops what still runs and deletes what the scenario left on the
// shared servers: broker objects, store keys and ledger entries.
func (e *env) cleanup() {
	e.stopConsumers()
	if e.shared != nil {
		_ = e.shared.Close()
	}
	if e.b.cleanup != nil {
		e.b.cleanup(e.t, e.url, e.topics, e.group)
	}
	ctx := context.Background()
	store := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: e.storeURL})
	defer store.Close()
	iter := store.Scan(ctx, 0, e.prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		_ = store.Del(ctx, iter.Val()).Err()
	}
	iter = e.ledger.Scan(ctx, 0, e.id+":*", 1000).Iterator()
	for iter.Next(ctx) {
		_ = e.ledger.Del(ctx, iter.Val()).Err()
	}
	for _, table := range e.pgTables {
		if _, err := e.pgPool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()); err != nil {
			e.t.Errorf("drop table %s: %v", table, err)
		}
	}
}

// pgScale divides the key counts of the heaviest scenarios on the pg-
// columns: every claim there is a statement on the one shared PostgreSQL,
// and the columns run beside all the others, two at a time on a two-CPU
// machine. A quarter of the keys still makes thousands of deliveries race
// for them.
const pgScale = 4

// size is n keys, or n/pgDiv on a pg- column.
func (e *env) size(n, pgDiv int) int {
	if e.b.pg {
		return n / pgDiv
	}
	return n
}

// effectsInPostgres moves the scenario's effects, on a pg- column, from the
// ledger to a PostgreSQL table of its own, each made in the handler's
// transaction together with COMPLETED (pgstore.CompleteInTx): the
// transactional path under a real broker's redeliveries. Elsewhere it does
// nothing.
func (e *env) effectsInPostgres() {
	if e.pgStore == nil {
		return
	}
	e.fxTable = testserver.UniqueName("e2e_fx_")
	e.pgTables = append(e.pgTables, e.fxTable)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// No unique key on (hash, key): a double must show as a second row.
	_, err := e.pgPool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{e.fxTable}.Sanitize()+
		" (id bigserial PRIMARY KEY, hash text NOT NULL, key text NOT NULL)")
	require.NoError(e.t, err)
}

// backend builds one member's Publisher and Subscriber; on gochannel every
// member gets the shared instance.
func (e *env) backend(consumer string) *backends.Backend {
	if e.shared != nil {
		return e.shared
	}
	cfg := e.b.config(e.url, e.group, e.id+"-"+consumer)
	if e.configure != nil {
		e.configure(&cfg)
	}
	b, err := backends.New(cfg, logger())
	require.NoError(e.t, err)
	return b
}

// newIdem is one consumer's middleware.
func (e *env) newIdem() *idempotency.Idempotency {
	idem, err := idempotency.New(e.idemConfig(e.newStore()), logger())
	require.NoError(e.t, err)
	return idem
}

func (e *env) idemConfig(store idempotency.Store) idempotency.Config {
	return idempotency.Config{
		Store:        store,
		KeyPrefix:    e.prefix,
		LeaseTTL:     e.lease,
		NackDelay:    nackDelay,
		StoreTimeout: time.Second,
		CompletedTTL: time.Hour,
		FailedTTL:    time.Hour,
		Observer:     e.obs,
	}
}

// consumer is one member of the group: its own connections and router.
type consumer struct {
	r      *message.Router
	b      *backends.Backend
	cancel context.CancelFunc
	done   chan struct{}
}

// startConsumers starts n members of the group, each with its own backend,
// store client and router; wire adds the handlers, after the tracker and
// the idempotency middleware.
func (e *env) startConsumers(n int, wire func(r *message.Router, b *backends.Backend)) {
	e.t.Helper()
	for i := range n {
		b := e.backend("c" + strconv.Itoa(i))
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger())
		require.NoError(e.t, err)
		r.AddMiddleware(e.tr.middleware, e.newIdem().Middleware)
		wire(r, b)
		ctx, cancel := context.WithCancel(context.Background())
		c := &consumer{r: r, b: b, cancel: cancel, done: make(chan struct{})}
		go func() { defer close(c.done); _ = r.Run(ctx) }()
		select {
		case <-r.Running():
		case <-time.After(30 * time.Second):
			e.t.Fatalf("consumer %d of %s did not start", i, e.id)
		}
		e.consumers = append(e.consumers, c)
		if e.shared != nil || len(e.consumers) == 1 {
			e.fanout.Store(int64(len(e.consumers)))
		}
	}
}

// handle starts n members whose one handler consumes the scenario's topic.
func (e *env) handle(n int, h message.NoPublishHandlerFunc) {
	e.startConsumers(n, func(r *message.Router, b *backends.Backend) {
		r.AddConsumerHandler(handlerName, e.topic, b.Subscriber, h)
	})
}

func (e *env) stopConsumers() {
	for _, c := range e.consumers {
		c.cancel()
		_ = c.r.Close()
		<-c.done
		if c.b != e.shared {
			_ = c.b.Close()
		}
	}
	e.consumers = nil
}

// effect records the side effect of msg's key in the ledger hash: the one
// thing that must happen exactly once per key. After effectsInPostgres it
// is a row of the effects table instead, see effectInTx.
func (e *env) effect(msg *message.Message, hash, key string) error {
	return e.effectOut(msg, hash, key, nil)
}

// effectOut is effect for a handler that returns out: on the transactional
// path, out is stored with COMPLETED, for duplicates to replay.
func (e *env) effectOut(msg *message.Message, hash, key string, out []*message.Message) error {
	if e.fxTable != "" {
		return e.effectInTx(msg, hash, key, out, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.ledger.HIncrBy(ctx, e.ledgerKey(hash), key, 1).Err(); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	e.effects.Store(hash+"/"+key, true)
	return nil
}

// effectInTx inserts the effect's row and writes COMPLETED, with out as the
// stored output, in one transaction, as a handler booking into its own
// database would. With fail set, it fails after the INSERT instead: the
// rollback must take the effect with it.
func (e *env) effectInTx(msg *message.Message, hash, key string, out []*message.Message, fail error) error {
	ctx := msg.Context()
	err := pgx.BeginFunc(ctx, e.pgPool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{e.fxTable}.Sanitize()+" (hash, key) VALUES ($1, $2)", hash, key); err != nil {
			return err
		}
		if fail != nil {
			return fail
		}
		if err := e.pgStore.CompleteInTx(ctx, tx, out...); err != nil {
			return err
		}
		// Marked before the commit: from the commit on, another consumer's
		// duplicate can find the key COMPLETED and be acked, and the mark
		// must already be there. Nothing sees COMPLETED before the commit
		// (the row stays locked), and a commit that fails leaves the key
		// without an effect, which checkLedger reports.
		e.effects.Store(hash+"/"+key, true)
		return nil
	})
	if err != nil {
		return fmt.Errorf("effect in PostgreSQL: %w", err)
	}
	return nil
}

func (e *env) ledgerKey(hash string) string { return e.id + ":" + hash }

// expectEffects says that each of keys must have its effect in hash once.
func (e *env) expectEffects(hash string, keys []string) {
	e.wantEffects[hash] = append(e.wantEffects[hash], keys...)
}

// newMsg is copy n of key, with the given UUID.
func newMsg(key string, n int, uuid string) *message.Message {
	m := message.NewMessage(uuid, []byte("payload of "+key))
	m.Metadata.Set("requestId", key)
	m.Metadata.Set(metaID, fmt.Sprintf("%s#%d", key, n))
	m.Metadata.Set(metaEffect, "up/"+key)
	return m
}

// expect registers msg as one that must end acked, or on a broker that
// drops repeated UUIDs, one of whose copies must.
func (e *env) expect(msg *message.Message) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.published++
	id := msg.Metadata.Get(metaID)
	group := id
	if e.b.dedupsUUID {
		group = "uuid:" + msg.UUID
	}
	e.groups[group] = append(e.groups[group], id)
	e.expected[id] = true
}

// expectID registers a message that the handlers themselves produce.
func (e *env) expectID(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.groups[id] = append(e.groups[id], id)
	e.expected[id] = true
}

// publish publishes msgs from several goroutines, as a fleet of producers
// would, and returns once they are all published.
func (e *env) publish(msgs ...*message.Message) {
	e.t.Helper()
	for _, m := range msgs {
		e.expect(m)
	}
	const workers = 8
	next := make(chan *message.Message)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range next {
				e.publishOne(m)
			}
		}()
	}
	for _, m := range msgs {
		next <- m
	}
	close(next)
	wg.Wait()
	e.requirePublished()
}

// publishPaced publishes msgs one every gap, in the background.
func (e *env) publishPaced(gap time.Duration, msgs ...*message.Message) {
	for _, m := range msgs {
		e.expect(m)
	}
	e.pubWG.Add(1)
	go func() {
		defer e.pubWG.Done()
		for _, m := range msgs {
			e.publishOne(m)
			time.Sleep(gap)
		}
	}()
}

func (e *env) publishOne(m *message.Message) {
	if err := e.pub.Publish(e.topic, m); err != nil {
		e.pubErr.CompareAndSwap(nil, fmt.Errorf("publish %s: %w", m.Metadata.Get(metaID), err))
	}
}

func (e *env) requirePublished() {
	e.t.Helper()
	if err, _ := e.pubErr.Load().(error); err != nil {
		e.t.Fatal(err)
	}
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

// finish waits until every expected message is acked and no delivery is
// left unsettled, stops the consumers, and checks the ledger and the
// accounting that every scenario shares. It prints the scenario's line.
func (e *env) finish() {
	e.t.Helper()
	e.pubWG.Wait()
	e.requirePublished()
	var snap snapshot
	deadline := e.start.Add(e.budget)
	for {
		var ok bool
		if snap, ok = e.settled(); ok {
			break
		}
		if time.Now().After(deadline) {
			e.stopConsumers()
			e.t.Fatalf("%s: not settled within the %v budget: %d of %d expected messages never acked (e.g. %v); "+
				"%d deliveries, %d acked, %d nacked, %d unsettled; outcomes %v; %s",
				e.id, e.budget, len(snap.missing), len(e.groups), first(snap.missing, 5),
				snap.deliveries, snap.acks, snap.nacks, snap.deliveries-snap.acks-snap.nacks, snap.outcomes, e.tr.detail(snap.missing))
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(e.start)
	e.stopConsumers()
	close(e.tr.stop)

	effects := e.checkLedger()
	o := snap.outcomes
	line := fmt.Sprintf("%-9s %-17s deliveries %6d  runs %5d  effects %5d  duplicates %5d  nacks %5d  elapsed %5.1fs  (published %d%s)",
		e.b.name, e.name, snap.deliveries, snap.runs, effects, o[idempotency.OutcomeDuplicate], snap.nacks,
		elapsed.Seconds(), e.published, e.noteText())
	e.t.Log(line)
	summary.add(e.b.name, e.name, line)

	assert.Zero(e.t, e.tr.ackedEarly.Load(), "messages acked before their key's effect was recorded, e.g. %v", e.tr.early())
	var keys int
	for _, k := range e.wantEffects {
		keys += len(k)
	}
	done := o[idempotency.OutcomeProcessed] + o[idempotency.OutcomeCompleteFailed] + o[idempotency.OutcomeLeaseLost]
	assert.Equal(e.t, keys, done, "one successful handler run per key (processed %d, complete_failed %d, lease_lost %d)",
		o[idempotency.OutcomeProcessed], o[idempotency.OutcomeCompleteFailed], o[idempotency.OutcomeLeaseLost])
	assert.Zero(e.t, o[idempotency.OutcomeLeaseLost], "no live handler lost its lease")
	assert.EqualValues(e.t, done+o[idempotency.OutcomeHandlerFailed], snap.runs, "every handler run has an outcome")
	assert.EqualValues(e.t, o[idempotency.OutcomeProcessed]+o[idempotency.OutcomeDuplicate]+o[idempotency.OutcomeCompleteFailed]-
		int(e.publishFailed.Load()), snap.acks,
		"acks are exactly the successful runs and the duplicates, less the runs whose output failed to publish")
	nackOutcomes := o[idempotency.OutcomeHandlerFailed] + o[idempotency.OutcomeInProgress] + o[idempotency.OutcomeStoreUnavailable] +
		int(e.publishFailed.Load())
	// A delivery whose context the subscriber cancels during the claim
	// (a Kafka rebalance) is nacked without an outcome; nothing else is.
	assert.GreaterOrEqual(e.t, int(snap.nacks), nackOutcomes, "every failed outcome was nacked")
	for _, bad := range []idempotency.Outcome{idempotency.OutcomeMissingKey, idempotency.OutcomeTooManyAttempts,
		idempotency.OutcomeKeyReused, idempotency.OutcomeFailOpen} {
		assert.Zero(e.t, o[bad], "outcome %s", bad)
	}
}

func (e *env) noteText() string {
	var s string
	if e.note != nil {
		s = ", " + e.note()
	}
	if e.fxTable != "" {
		s += ", effects and COMPLETED in one PostgreSQL transaction"
	}
	return s
}

// checkLedger asserts that every wanted key had its effect exactly once and
// no other key had any, and returns the number of effects.
func (e *env) checkLedger() int {
	e.t.Helper()
	total := 0
	for hash, keys := range e.wantEffects {
		got := e.effectCounts(hash)
		var missing, twice []string
		for _, k := range keys {
			switch got[k] {
			case "1":
			case "":
				missing = append(missing, k)
			default:
				twice = append(twice, k+"×"+got[k])
			}
		}
		for _, v := range got {
			n, _ := strconv.Atoi(v)
			total += n
		}
		assert.Empty(e.t, missing, "%s: keys whose effect never happened", hash)
		assert.Empty(e.t, twice, "%s: keys whose effect happened more than once", hash)
		assert.Len(e.t, got, len(keys), "%s: effects of unknown keys", hash)
	}
	return total
}

// effectCounts is, per key, how many effects hash holds: from the ledger,
// or from the effects table after effectsInPostgres.
func (e *env) effectCounts(hash string) map[string]string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if e.fxTable == "" {
		got, err := e.ledger.HGetAll(ctx, e.ledgerKey(hash)).Result()
		require.NoError(e.t, err)
		return got
	}
	rows, err := e.pgPool.Query(ctx, "SELECT key, count(*) FROM "+pgx.Identifier{e.fxTable}.Sanitize()+
		" WHERE hash = $1 GROUP BY key", hash)
	require.NoError(e.t, err)
	got := map[string]string{}
	var key string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		got[key] = strconv.FormatInt(n, 10)
		return nil
	})
	require.NoError(e.t, err)
	return got
}

// snapshot is the counters at one moment.
type snapshot struct {
	deliveries, acks, nacks, runs int64
	outcomes                      map[idempotency.Outcome]int
	missing                       []string
}

// settled takes a consistent snapshot and reports whether the run is over:
// every expected message acked (by every consumer, on gochannel), every
// delivery acked or nacked.
func (e *env) settled() (snapshot, bool) {
	read := func() snapshot {
		s := snapshot{runs: e.runs.Load(), outcomes: e.obs.counts()}
		s.deliveries, s.acks, s.nacks, s.missing = e.tr.state()
		return s
	}
	a := read()
	if len(a.missing) > 0 || a.deliveries != a.acks+a.nacks {
		return a, false
	}
	// A delivery could have slipped in between the counters; read again.
	b := read()
	return b, a.deliveries == b.deliveries && a.acks == b.acks && a.runs == b.runs
}

func first(s []string, n int) []string {
	sort.Strings(s)
	if len(s) > n {
		return s[:n]
	}
	return s
}

// tracker is the outermost middleware of every consumer: it counts
// deliveries and watches each message until the router acks or nacks it.
type tracker struct {
	e                        *env
	stop                     chan struct{}
	deliveries, acks, nacks  atomic.Int64
	ackedEarly               atomic.Int64
	mu                       sync.Mutex
	delivered, acked, earlyM map[string]int
}

func newTracker(e *env) *tracker {
	return &tracker{e: e, stop: make(chan struct{}),
		delivered: map[string]int{}, acked: map[string]int{}, earlyM: map[string]int{}}
}

func (tr *tracker) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		id := msg.Metadata.Get(metaID)
		tr.mu.Lock()
		tr.delivered[id]++
		tr.mu.Unlock()
		tr.deliveries.Add(1)
		go tr.watch(msg, id, msg.Metadata.Get(metaEffect))
		return h(msg)
	}
}

// watch counts how the router settles msg. The router settles every
// message it hands to a handler, once the handler returns.
func (tr *tracker) watch(msg *message.Message, id, effect string) {
	select {
	case <-msg.Acked():
		if _, ok := tr.e.effects.Load(effect); !ok {
			tr.ackedEarly.Add(1)
			tr.mu.Lock()
			tr.earlyM[id]++
			tr.mu.Unlock()
		}
		tr.mu.Lock()
		tr.acked[id]++
		tr.mu.Unlock()
		tr.acks.Add(1)
	case <-msg.Nacked():
		tr.nacks.Add(1)
	case <-tr.stop:
	}
}

// state returns the counters and the expected messages not acked yet.
func (tr *tracker) state() (deliveries, acks, nacks int64, missing []string) {
	// Settled counters first: a delivery counted after them can only make
	// deliveries larger, never hide an unsettled one.
	acks, nacks = tr.acks.Load(), tr.nacks.Load()
	deliveries = tr.deliveries.Load()
	tr.e.mu.Lock()
	defer tr.e.mu.Unlock()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	need := max(1, int(tr.e.fanout.Load()))
groups:
	for _, ids := range tr.e.groups {
		for _, id := range ids {
			if tr.acked[id] >= need {
				continue groups
			}
		}
		missing = append(missing, strings.Join(ids, "|"))
	}
	return deliveries, acks, nacks, missing
}

// deliveredTimes is how often the message id was delivered.
func (tr *tracker) deliveredTimes(id string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.delivered[id]
}

// detail describes, for a failure message, how the missing messages and
// those acked more than once or unexpectedly were delivered.
func (tr *tracker) detail(missing []string) string {
	tr.e.mu.Lock()
	defer tr.e.mu.Unlock()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var b strings.Builder
	for _, group := range first(missing, 10) {
		for _, id := range strings.Split(group, "|") {
			fmt.Fprintf(&b, "missing %s delivered %d; ", id, tr.delivered[id])
		}
	}
	n := 0
	for id, c := range tr.acked {
		if (c > 1 || !tr.e.expected[id]) && n < 10 {
			n++
			fmt.Fprintf(&b, "%s delivered %d acked %d; ", id, tr.delivered[id], c)
		}
	}
	return b.String()
}

func (tr *tracker) early() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var ids []string
	for id := range tr.earlyM {
		ids = append(ids, id)
	}
	return first(ids, 5)
}

// observer counts the middleware's outcomes and store operations.
type observer struct {
	mu       sync.Mutex
	outcomes map[idempotency.Outcome]int
	ops      map[string]int
}

func newObserver() *observer {
	return &observer{outcomes: map[idempotency.Outcome]int{}, ops: map[string]int{}}
}

func (o *observer) Outcome(_ string, outcome idempotency.Outcome) {
	o.mu.Lock()
	o.outcomes[outcome]++
	o.mu.Unlock()
}

func (o *observer) StoreLatency(op string, _ time.Duration, err error) {
	if err != nil {
		return
	}
	o.mu.Lock()
	o.ops[op]++
	o.mu.Unlock()
}

func (o *observer) counts() map[idempotency.Outcome]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := make(map[idempotency.Outcome]int, len(o.outcomes))
	for k, v := range o.outcomes {
		c[k] = v
	}
	return c
}

func (o *observer) get(outcome idempotency.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.outcomes[outcome]
}

// op is how many store calls of op succeeded.
func (o *observer) op(op string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ops[op]
}

// summary collects every scenario's line for the table printed at the end.
var summary = &lines{m: map[string]string{}}

type lines struct {
	mu sync.Mutex
	m  map[string]string
}

func (l *lines) add(broker, scenario, line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[broker+"/"+scenario] = line
}

func (l *lines) table(order func(string) int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]string, 0, len(l.m))
	for k := range l.m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return order(keys[i]) < order(keys[j]) })
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(l.m[k])
		b.WriteByte('\n')
	}
	return b.String()
}
