package e2e

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// check is one expectation of a scenario, checked once the run is over; it
// reports through t.
type check func(t assert.TestingT)

// requireExactlyOnce ends a scenario. It waits until every expected
// message is acked and every delivery settled, stops the consumers, prints
// the scenario's line, and checks what every scenario must show, then the
// scenario's own checks, also:
//   - each wanted key's effect happened exactly once, and no other key had
//     one;
//   - every published message was acked and every delivery settled (or the
//     budget ran out), and none was acked before its key's effect was
//     recorded;
//   - acks and nacks add up to the middleware's outcomes, one successful
//     run per key, and no outcome that must not happen.
//
// If any check fails, it ends the test with every count of the run.
func (e *env) requireExactlyOnce(also ...check) {
	e.t.Helper()
	a := e.settle()
	e.report(fmt.Sprintf("deliveries %6d  runs %5d  effects %5d  duplicates %5d  nacks %5d  elapsed %5.1fs  (published %d%s)",
		a.deliveries, a.runs, a.effects, a.outcomes[idempotency.OutcomeDuplicate], a.nacks,
		a.elapsed.Seconds(), a.published, e.noteText()))
	e.requireAll(a.String(), append([]check{checkEffects(a.ledger), a.checkSettlement, a.checkOutcomes}, also...)...)
}

// accounts are a run's counts once it is over: what the shared checks read,
// and what a failure reports whole.
type accounts struct {
	snapshot
	elapsed       time.Duration
	published     int
	publishFailed int
	effects       int
	wantKeys      int
	ledger        []hashCount
	ackedEarly    int64
	early         []string
}

func (a *accounts) String() string {
	return fmt.Sprintf("published %d, deliveries %d, acked %d, nacked %d, handler runs %d, effects %d of %d keys %v, "+
		"acked before their effect %d %v, output publishes failed %d, outcomes %v, elapsed %.1fs",
		a.published, a.deliveries, a.acks, a.nacks, a.runs, a.effects, a.wantKeys, a.ledger,
		a.ackedEarly, a.early, a.publishFailed, a.outcomes, a.elapsed.Seconds())
}

func (c hashCount) String() string {
	return fmt.Sprintf("%s: %d keys of %d, missing %v, more than once %v", c.hash, c.got, c.want, first(c.missing, 5), first(c.twice, 5))
}

// settle waits until the run is over, failing the test with the counts if
// the budget runs out first, stops the consumers, and counts.
func (e *env) settle() *accounts {
	e.t.Helper()
	e.pubWG.Wait()
	e.requirePublished()
	snap := e.awaitSettled()
	elapsed := time.Since(e.start)
	e.stopConsumers()
	close(e.tr.stop)
	a := &accounts{snapshot: snap, elapsed: elapsed, published: e.published, publishFailed: int(e.publishFailed.Load()),
		ackedEarly: e.tr.ackedEarly.Load(), early: e.tr.early()}
	a.ledger, a.effects = e.countEffects()
	for _, keys := range e.wantEffects {
		a.wantKeys += len(keys)
	}
	return a
}

// awaitSettled polls until every expected message is acked (by every
// consumer, on gochannel) and no delivery is left unsettled.
func (e *env) awaitSettled() snapshot {
	e.t.Helper()
	deadline := e.start.Add(e.budget)
	for {
		snap, ok := e.settled()
		if ok {
			return snap
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
}

// checkEffects: every wanted key had its effect exactly once, and no other
// key had any.
func checkEffects(ledger []hashCount) check {
	return func(t assert.TestingT) {
		for _, c := range ledger {
			assert.Empty(t, c.missing, "%s: keys whose effect never happened", c.hash)
			assert.Empty(t, c.twice, "%s: keys whose effect happened more than once", c.hash)
			assert.Equal(t, c.want, c.got, "%s: effects of unknown keys", c.hash)
		}
	}
}

// checkSettlement: no message was acked before its key's effect was
// recorded, and acks and nacks are the outcomes that call for them.
func (a *accounts) checkSettlement(t assert.TestingT) {
	o := a.outcomes
	assert.Zero(t, a.ackedEarly, "messages acked before their key's effect was recorded, e.g. %v", a.early)
	assert.EqualValues(t, o[idempotency.OutcomeProcessed]+o[idempotency.OutcomeDuplicate]+o[idempotency.OutcomeCompleteFailed]-
		a.publishFailed, a.acks,
		"acks are exactly the successful runs and the duplicates, less the runs whose output failed to publish")
	nackOutcomes := o[idempotency.OutcomeHandlerFailed] + o[idempotency.OutcomeInProgress] + o[idempotency.OutcomeStoreUnavailable] +
		a.publishFailed
	// A delivery whose context the subscriber cancels during the claim
	// (a Kafka rebalance) is nacked without an outcome; nothing else is.
	assert.GreaterOrEqual(t, int(a.nacks), nackOutcomes, "every failed outcome was nacked")
}

// checkOutcomes: one successful handler run per key, an outcome for every
// run, and none of the outcomes that a healthy run never has.
func (a *accounts) checkOutcomes(t assert.TestingT) {
	o := a.outcomes
	done := o[idempotency.OutcomeProcessed] + o[idempotency.OutcomeCompleteFailed] + o[idempotency.OutcomeLeaseLost]
	assert.Equal(t, a.wantKeys, done, "one successful handler run per key (processed %d, complete_failed %d, lease_lost %d)",
		o[idempotency.OutcomeProcessed], o[idempotency.OutcomeCompleteFailed], o[idempotency.OutcomeLeaseLost])
	assert.Zero(t, o[idempotency.OutcomeLeaseLost], "no live handler lost its lease")
	assert.EqualValues(t, done+o[idempotency.OutcomeHandlerFailed], a.runs, "every handler run has an outcome")
	for _, bad := range []idempotency.Outcome{idempotency.OutcomeMissingKey, idempotency.OutcomeTooManyAttempts,
		idempotency.OutcomeKeyReused, idempotency.OutcomeFailOpen} {
		assert.Zero(t, o[bad], "outcome %s", bad)
	}
}

// requireAll runs every check, each reporting its own failures, and ends
// the test with the run's counts if any failed.
func (e *env) requireAll(counts string, checks ...check) {
	e.t.Helper()
	f := &failures{t: e.t}
	for _, c := range checks {
		c(f)
	}
	if f.n > 0 {
		e.t.Fatalf("%s: %d checks failed; the run's counts: %s", e.id, f.n, counts)
	}
}

// failures passes each failure on to t and counts them.
type failures struct {
	t *testing.T
	n int
}

func (f *failures) Errorf(format string, args ...any) {
	f.t.Helper()
	f.n++
	f.t.Errorf(format, args...)
}

func (f *failures) Helper() { f.t.Helper() }

// report logs the scenario's line and keeps it for the summary table.
func (e *env) report(counts string) {
	e.t.Helper()
	line := fmt.Sprintf("%-9s %-17s %s", e.b.name, e.name, counts)
	e.t.Log(line)
	summary.add(e.b.name, e.name, line)
}

func (e *env) noteText() string {
	var s string
	if e.note != nil {
		s = ", " + e.note()
	}
	switch {
	case e.fxTable != "" && e.b.mysql:
		s += ", effects and COMPLETED in one MySQL transaction"
	case e.fxTable != "":
		s += ", effects and COMPLETED in one PostgreSQL transaction"
	}
	return s
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
