package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// failoverRun is what one run of the Sentinel failover test saw.
type failoverRun struct {
	done      int // keys whose Do returned nil before the redelivery
	completed int // of them, Do reported OutcomeProcessed: COMPLETED was written
	covered   int // of those, every claim, renewal and completion acknowledged by the replica
	lost      int // completed keys the new master does not hold as COMPLETED
	lostCov   int // of them, covered ones
	repeated  int // keys whose effect ran more than once after every key was redelivered
	repCov    int // of them, covered ones
	shortfall redisstore.ReplicaStats
}

func (r failoverRun) String() string {
	return fmt.Sprintf("keys done %d, completed %d (replica-acknowledged %d), completed keys lost in the failover %d (acknowledged %d), effects repeated on redelivery %d (acknowledged %d), WAIT acknowledged %d, shortfalls %d",
		r.done, r.completed, r.covered, r.lost, r.lostCov, r.repeated, r.repCov, r.shortfall.Acknowledged, r.shortfall.Shortfalls)
}

// TestSentinelFailover kills the master of a Sentinel set (one master, one
// replica, three sentinels, all private redis-server processes) under a
// steady stream of Once.Do runs through a go-redis failover client, while
// the replica lags 30 ms behind (a delayed replication link, reset at the
// kill, so that what the master had not yet shipped is lost with it). Then
// every key is redelivered, as a broker would after the outage.
//
// With replica acknowledgement (Options.Replicas 1), every completion that
// the replica acknowledged survives the failover and no acknowledged key's
// effect runs again. Without it, completions of the last moments before the
// kill are lost and their effects run again on redelivery: the counts are
// logged.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 0} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			t.Parallel()
			run := sentinelFailover(t, replicas)
			t.Logf("replica acknowledgement %d: %v", replicas, run)
			if replicas > 0 {
				assert.Positive(t, run.covered, "some completions were acknowledged by the replica")
				assert.Zero(t, run.lostCov, "an acknowledged completion was lost in the failover")
				assert.Zero(t, run.repCov, "an acknowledged key's effect ran again")
				assert.Positive(t, run.shortfall.Acknowledged)
			} else {
				assert.Zero(t, run.shortfall, "no WAIT without replica acknowledgement")
			}
		})
	}
}

func sentinelFailover(t *testing.T, replicas int) failoverRun {
	set := testserver.StartSentinelSet(t, testserver.SentinelOptions{ReplicationLatency: 30 * time.Millisecond})
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            set.MasterName,
		SentinelAddrs:         set.SentinelAddrs,
		ContextTimeoutEnabled: true,
		DialTimeout:           200 * time.Millisecond,
	})
	t.Cleanup(func() { _ = client.Close() })

	var (
		mu        sync.Mutex
		short     = map[string]bool{} // keys with a shortfall in any transition
		effects   = map[string]int{}
		outcomes  = map[string]idempotency.Outcome{}
		doneOrder []string
	)
	store, err := redisstore.NewWithOptions(client, redisstore.Options{
		Replicas:       replicas,
		ReplicaTimeout: 500 * time.Millisecond,
		OnReplicaShortfall: func(s redisstore.ReplicaShortfall) {
			mu.Lock()
			short[s.Key] = true
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	// A lease longer than the failover takes: a completion caught by the
	// kill is retried within it, on the new master.
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: 6 * time.Second, StoreTimeout: time.Second})
	require.NoError(t, err)
	work := func(key string) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) {
			mu.Lock()
			effects[key]++
			mu.Unlock()
			return []byte("ok"), nil
		}
	}
	// process runs Do for key until it returns nil, as redeliveries would.
	process := func(key string, deadline time.Time) idempotency.Outcome {
		for {
			res, err := once.Do(context.Background(), key, work(key))
			if err == nil {
				return res.Outcome
			}
			if !errors.Is(err, idempotency.ErrStoreUnavailable) && !errors.Is(err, idempotency.ErrInProgress) {
				t.Errorf("Do %s: %v", key, err)
				return ""
			}
			if time.Now().After(deadline) {
				t.Errorf("Do %s: still failing at the deadline: %v", key, err)
				return ""
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	deadline := time.Now().Add(40 * time.Second)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("k%d-%d", w, i)
				outcome := process(key, deadline)
				mu.Lock()
				outcomes[key] = outcome
				doneOrder = append(doneOrder, key)
				mu.Unlock()
			}
		}()
	}

	time.Sleep(time.Second) // a steady stream before the kill
	require.True(t, set.ReplicatesThroughLink(), "the replica must replicate through the delayed link")
	set.KillMaster()
	newMaster := set.WaitFailover(20 * time.Second)
	time.Sleep(500 * time.Millisecond) // the stream goes on on the new master
	stop.Store(true)
	wg.Wait()

	// Look at what the new master holds, then redeliver every key.
	direct := redis.NewClient(&redis.Options{Addr: newMaster, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = direct.Close() })
	plain, err := redisstore.New(direct) // no replica is left to wait for
	require.NoError(t, err)
	var run failoverRun
	run.shortfall = store.ReplicaStats()
	mu.Lock()
	keys := append([]string(nil), doneOrder...)
	mu.Unlock()
	run.done = len(keys)
	for _, key := range keys {
		mu.Lock()
		outcome, covered := outcomes[key], !short[key]
		mu.Unlock()
		if outcome != idempotency.OutcomeProcessed {
			continue
		}
		run.completed++
		if covered && replicas > 0 {
			run.covered++
		}
		rec, err := plain.Get(context.Background(), key)
		require.NoError(t, err)
		if rec.State != idempotency.StateCompleted {
			run.lost++
			if covered && replicas > 0 {
				run.lostCov++
				t.Logf("acknowledged completion of %s lost: %v", key, rec.State)
			}
		}
	}
	redeliver, err := idempotency.NewOnce(idempotency.OnceConfig{Store: plain, LeaseTTL: 6 * time.Second, StoreTimeout: time.Second})
	require.NoError(t, err)
	once = redeliver
	for _, key := range keys {
		process(key, time.Now().Add(15*time.Second))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, key := range keys {
		if effects[key] > 1 {
			run.repeated++
			if replicas > 0 && outcomes[key] == idempotency.OutcomeProcessed && !short[key] {
				run.repCov++
			}
		}
	}
	return run
}
