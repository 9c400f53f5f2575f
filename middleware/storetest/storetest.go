package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware"
)

// Subject is one store under test.
type Subject struct {
	// Store is the store under test, fresh or shared: the suite's keys are
	// unique to each subtest.
	Store middleware.Store
	// Advance moves the store's clock forward by d. Nil means the store keeps
	// real time, and the suite sleeps instead.
	Advance func(d time.Duration)
}

// lease is the lease of the suite's claims; long enough that scheduling noise
// on a loaded machine never expires one early, short enough to sleep through.
const lease = 300 * time.Millisecond

// past is how far the suite moves time to be sure a lease or TTL has expired.
const past = lease + 100*time.Millisecond

// ttl is the COMPLETED and FAILED TTL of the suite's records.
const ttl = lease

// Run runs the conformance suite against the stores that newStore returns,
// one per subtest. Subtests run in parallel.
func Run(t *testing.T, newStore func(t *testing.T) Subject) {
	run := randomHex(8)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			h := &harness{t: t, Subject: s, ctx: context.Background(),
				prefix: "storetest:" + run + ":" + tc.name + ":"}
			t.Cleanup(h.cleanup)
			tc.fn(h)
		})
	}
}

type harness struct {
	Subject
	t      *testing.T
	ctx    context.Context
	prefix string

	mu   sync.Mutex
	keys []string
}

// key returns a key unique to this subtest, remembered for cleanup.
func (h *harness) key(suffix string) string {
	k := h.prefix + suffix
	h.mu.Lock()
	h.keys = append(h.keys, k)
	h.mu.Unlock()
	return k
}

func (h *harness) cleanup() {
	for _, k := range h.keys {
		_ = h.Store.Delete(context.Background(), k)
	}
}

func (h *harness) advance(d time.Duration) {
	if h.Advance != nil {
		h.Advance(d)
		return
	}
	time.Sleep(d)
}

func (h *harness) claim(key string, fp []byte) middleware.ClaimResult {
	h.t.Helper()
	res, err := h.Store.Claim(h.ctx, key, lease, fp)
	require.NoError(h.t, err)
	return res
}

func (h *harness) mustAcquire(key string) string {
	h.t.Helper()
	res := h.claim(key, nil)
	require.True(h.t, res.Acquired, "claim of %q must acquire, record %+v", key, res.Record)
	require.NotEmpty(h.t, res.Token)
	return res.Token
}

func (h *harness) get(key string) middleware.Record {
	h.t.Helper()
	rec, err := h.Store.Get(h.ctx, key)
	require.NoError(h.t, err)
	return rec
}

var cases = []struct {
	name string
	fn   func(h *harness)
}{
	{"ClaimAbsentAcquires", testClaimAbsent},
	{"ClaimRaceHasOneWinner", testClaimRace},
	{"ClaimInProgressIsRefused", testClaimInProgress},
	{"CompleteStoresResult", testComplete},
	{"ResultRoundTrip", testResultRoundTrip},
	{"StaleOwnerIsFenced", testStaleOwner},
	{"RenewExtendsLease", testRenew},
	{"ExpiredLeaseIsClaimable", testLeaseExpiry},
	{"FailCountsAttempts", testFailAttempts},
	{"CompletedExpires", testCompletedExpires},
	{"FailedExpires", testFailedExpires},
	{"OddKeys", testOddKeys},
	{"Fingerprint", testFingerprint},
	{"Delete", testDelete},
	{"CancelledContext", testCancelledContext},
	{"BadArguments", testBadArguments},
}

func testClaimAbsent(h *harness) {
	t, k := h.t, h.key("k")
	assert.Equal(t, middleware.StateAbsent, h.get(k).State)
	res := h.claim(k, nil)
	require.True(t, res.Acquired)
	assert.Len(t, res.Token, 32, "owner token is 128 bits in hex")
	assert.Equal(t, res.Token, res.Record.Token)
	assert.Equal(t, middleware.StateInProgress, res.Record.State)
	assert.Equal(t, 1, res.Record.Attempts)
	assert.False(t, res.Record.CreatedAt.IsZero())

	rec := h.get(k)
	assert.Equal(t, middleware.StateInProgress, rec.State)
	assert.Equal(t, res.Token, rec.Token)
	assert.Equal(t, 1, rec.Attempts)
	assert.Nil(t, rec.Result)

	other := h.claim(h.key("other"), nil)
	require.True(t, other.Acquired)
	assert.NotEqual(t, res.Token, other.Token, "tokens are random")
}

func testClaimRace(h *harness) {
	const claimers, rounds = 64, 100
	for round := range rounds {
		k := h.key("race:" + string(rune('a'+round%26)) + randomHex(4))
		var wins atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, claimers)
		for range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := h.Store.Claim(h.ctx, k, time.Minute, nil)
				if err != nil {
					errs <- err
					return
				}
				if res.Acquired {
					wins.Add(1)
				} else if res.Record.State != middleware.StateInProgress || res.Record.Token != "" {
					errs <- errors.New("a refused claim must see IN_PROGRESS without the owner's token")
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(h.t, err)
		}
		require.EqualValues(h.t, 1, wins.Load(), "round %d: exactly one of %d claimers must win", round, claimers)
	}
}

func testClaimInProgress(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	res := h.claim(k, nil)
	assert.False(t, res.Acquired)
	assert.Empty(t, res.Token)
	assert.Equal(t, middleware.StateInProgress, res.Record.State)
	assert.Empty(t, res.Record.Token, "another owner's token is never handed out by Claim")
	assert.Equal(t, tok, h.get(k).Token, "a refused claim changes nothing")
}

func testComplete(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, []byte("output"), time.Minute))

	rec := h.get(k)
	assert.Equal(t, middleware.StateCompleted, rec.State)
	assert.Empty(t, rec.Token)
	assert.Equal(t, []byte("output"), rec.Result)
	assert.Equal(t, 1, rec.Attempts)
	assert.False(t, rec.UpdatedAt.Before(rec.CreatedAt))

	res := h.claim(k, nil)
	assert.False(t, res.Acquired, "a COMPLETED key is never claimed again")
	assert.Equal(t, middleware.StateCompleted, res.Record.State)
	assert.Equal(t, []byte("output"), res.Record.Result, "the duplicate's claim returns the result")

	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, []byte("again"), time.Minute), middleware.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, time.Minute), middleware.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, tok, time.Minute), middleware.ErrLeaseLost)
	assert.Equal(t, []byte("output"), h.get(k).Result, "a second Complete changes nothing")
}

func testResultRoundTrip(h *harness) {
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	for name, result := range map[string][]byte{
		"empty": {},
		"nil":   nil,
		"1MiB":  big,
		"odd":   []byte("\x00\r\n\"'{}[[]]--\xff\xfe"),
	} {
		k := h.key("result:" + name)
		tok := h.mustAcquire(k)
		require.NoError(h.t, h.Store.Complete(h.ctx, k, tok, result, time.Minute))
		for _, rec := range []middleware.Record{h.get(k), h.claim(k, nil).Record} {
			require.NotNil(h.t, rec.Result, "%s: a completed record's result is non-nil", name)
			require.True(h.t, bytes.Equal(result, rec.Result), "%s: result of %d bytes came back as %d bytes", name, len(result), len(rec.Result))
		}
	}
}

func testStaleOwner(h *harness) {
	t, k := h.t, h.key("k")
	stale := h.mustAcquire(k)
	h.advance(past)
	fresh := h.claim(k, nil)
	require.True(t, fresh.Acquired, "an expired lease is claimable")
	assert.Equal(t, 1, fresh.Record.Attempts, "an expired lease leaves no record: attempts restart")

	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, stale, lease), middleware.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, stale, []byte("stale"), time.Minute), middleware.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, stale, time.Minute), middleware.ErrLeaseLost)
	rec := h.get(k)
	assert.Equal(t, middleware.StateInProgress, rec.State, "a stale owner changes nothing")
	assert.Equal(t, fresh.Token, rec.Token)

	require.NoError(t, h.Store.Complete(h.ctx, k, fresh.Token, []byte("fresh"), time.Minute))
	assert.Equal(t, []byte("fresh"), h.get(k).Result)

	// A stale owner whose key nobody claimed again is fenced as well.
	k2 := h.key("k2")
	tok := h.mustAcquire(k2)
	h.advance(past)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k2, tok, nil, time.Minute), middleware.ErrLeaseLost)
	assert.Equal(t, middleware.StateAbsent, h.get(k2).State)
}

func testRenew(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	for range 3 {
		h.advance(lease * 2 / 3)
		require.NoError(t, h.Store.Renew(h.ctx, k, tok, lease))
	}
	// Twice the lease has passed since the claim; renewals kept it alive.
	assert.False(t, h.claim(k, nil).Acquired, "a renewed lease is not claimable")
	require.NoError(t, h.Store.Renew(h.ctx, k, tok, 4*lease), "renew may lengthen the lease")
	h.advance(past)
	assert.False(t, h.claim(k, nil).Acquired, "the lengthened lease holds past the original one")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, "not-the-owner", lease), middleware.ErrLeaseLost)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute))
}

func testLeaseExpiry(h *harness) {
	t, k := h.t, h.key("k")
	h.mustAcquire(k)
	h.advance(lease / 3)
	assert.False(t, h.claim(k, nil).Acquired, "a live lease is not claimable")
	h.advance(past)
	assert.Equal(t, middleware.StateAbsent, h.get(k).State)
	assert.True(t, h.claim(k, nil).Acquired)
}

func testFailAttempts(h *harness) {
	t, k := h.t, h.key("k")
	for attempt := 1; attempt <= 3; attempt++ {
		res := h.claim(k, nil)
		require.True(t, res.Acquired, "a FAILED key is claimable (attempt %d)", attempt)
		assert.Equal(t, attempt, res.Record.Attempts)
		require.NoError(t, h.Store.Fail(h.ctx, k, res.Token, time.Minute))
		rec := h.get(k)
		assert.Equal(t, middleware.StateFailed, rec.State)
		assert.Equal(t, attempt, rec.Attempts)
		assert.Empty(t, rec.Token)
		assert.ErrorIs(t, h.Store.Renew(h.ctx, k, res.Token, lease), middleware.ErrLeaseLost, "fail ends the lease")
	}
	res := h.claim(k, nil)
	require.True(t, res.Acquired)
	require.NoError(t, h.Store.Complete(h.ctx, k, res.Token, []byte("ok"), time.Minute))
	rec := h.get(k)
	assert.Equal(t, 4, rec.Attempts, "attempts survive completion")
	assert.Equal(t, middleware.StateCompleted, rec.State)
}

func testCompletedExpires(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, []byte("r"), ttl))
	h.advance(ttl / 3)
	assert.Equal(t, middleware.StateCompleted, h.get(k).State)
	h.advance(past)
	assert.Equal(t, middleware.StateAbsent, h.get(k).State)
	res := h.claim(k, nil)
	assert.True(t, res.Acquired)
	assert.Equal(t, 1, res.Record.Attempts)
}

func testFailedExpires(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Fail(h.ctx, k, tok, ttl))
	h.advance(past)
	assert.Equal(t, middleware.StateAbsent, h.get(k).State)
	res := h.claim(k, nil)
	assert.True(t, res.Acquired)
	assert.Equal(t, 1, res.Record.Attempts, "an expired FAILED record no longer counts")
}

func testOddKeys(h *harness) {
	huge := strings.Repeat("k", 1<<20)
	for name, suffix := range map[string]string{
		"1MiB":     huge,
		"nul":      "a\x00b",
		"newline":  "a\nb\r\n",
		"quotes":   `'"` + "`",
		"braces":   "{tag}x{}",
		"lua":      "]]--[[ %s %d \\ .. nil end",
		"not-utf8": "\xff\xfe\xc3\x28",
		"spaces":   " \t ",
	} {
		k := h.key(suffix)
		tok := h.mustAcquire(k)
		require.NoError(h.t, h.Store.Renew(h.ctx, k, tok, lease), name)
		require.NoError(h.t, h.Store.Complete(h.ctx, k, tok, []byte(name), time.Minute), name)
		rec := h.get(k)
		assert.Equal(h.t, middleware.StateCompleted, rec.State, name)
		assert.Equal(h.t, []byte(name), rec.Result, name)
		if name != "nul" && name != "1MiB" {
			// A key must be stored as itself: a truncating store would make
			// these two collide.
			assert.Equal(h.t, middleware.StateAbsent, h.get(h.prefix+suffix[:len(suffix)-1]).State, name)
		}
	}
	a, b := h.key("x\x00y"), h.key("x\x00z")
	h.mustAcquire(a)
	h.mustAcquire(b) // keys differing after a NUL are different keys
}

func testFingerprint(h *harness) {
	t, k := h.t, h.key("k")
	fpA, fpB := []byte("sha256:A\x00\xff"), []byte("sha256:B")
	res := h.claim(k, fpA)
	require.True(t, res.Acquired)
	assert.Equal(t, fpA, res.Record.Fingerprint)

	other := h.claim(k, fpB)
	assert.False(t, other.Acquired)
	assert.Equal(t, fpA, other.Record.Fingerprint, "the stored fingerprint comes back to tell a reused key")

	require.NoError(t, h.Store.Fail(h.ctx, k, res.Token, time.Minute))
	other = h.claim(k, fpB)
	assert.False(t, other.Acquired, "a different fingerprint never acquires, even a FAILED key")
	assert.Equal(t, middleware.StateFailed, other.Record.State)
	assert.Equal(t, fpA, other.Record.Fingerprint)

	again := h.claim(k, nil)
	require.True(t, again.Acquired, "no fingerprint given: no comparison")
	assert.Equal(t, fpA, again.Record.Fingerprint, "the first fingerprint is kept")
	assert.Equal(t, 2, again.Record.Attempts)
	require.NoError(t, h.Store.Complete(h.ctx, k, again.Token, []byte("r"), time.Minute))

	same := h.claim(k, fpA)
	assert.False(t, same.Acquired)
	assert.Equal(t, middleware.StateCompleted, same.Record.State)
	assert.Equal(t, fpA, same.Record.Fingerprint)
	assert.Equal(t, fpA, h.get(k).Fingerprint)
}

func testDelete(h *harness) {
	t, k := h.t, h.key("k")
	require.NoError(t, h.Store.Delete(h.ctx, k), "deleting an absent key is fine")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Delete(h.ctx, k))
	assert.Equal(t, middleware.StateAbsent, h.get(k).State)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute), middleware.ErrLeaseLost)
	res := h.claim(k, nil)
	require.True(t, res.Acquired)
	require.NoError(t, h.Store.Complete(h.ctx, k, res.Token, nil, time.Minute))
	require.NoError(t, h.Store.Delete(h.ctx, k))
	assert.True(t, h.claim(k, nil).Acquired, "a deleted COMPLETED key starts afresh")
}

func testCancelledContext(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := h.Store.Claim(ctx, h.key("other"), lease, nil)
	assert.ErrorIs(t, err, context.Canceled, "claim")
	assert.ErrorIs(t, h.Store.Renew(ctx, k, tok, lease), context.Canceled, "renew")
	assert.ErrorIs(t, h.Store.Complete(ctx, k, tok, nil, time.Minute), context.Canceled, "complete")
	assert.ErrorIs(t, h.Store.Fail(ctx, k, tok, time.Minute), context.Canceled, "fail")
	_, err = h.Store.Get(ctx, k)
	assert.ErrorIs(t, err, context.Canceled, "get")
	assert.ErrorIs(t, h.Store.Delete(ctx, k), context.Canceled, "delete")

	assert.Equal(t, middleware.StateAbsent, h.get(h.key("other")).State, "a cancelled claim changes nothing")
	rec := h.get(k)
	assert.Equal(t, middleware.StateInProgress, rec.State, "cancelled calls change nothing")
	assert.Equal(t, tok, rec.Token)
}

func testBadArguments(h *harness) {
	t, k := h.t, h.key("k")
	for _, d := range []time.Duration{0, -time.Second} {
		_, err := h.Store.Claim(h.ctx, k, d, nil)
		assert.ErrorIs(t, err, middleware.ErrInvalidTTL, "claim lease %v", d)
	}
	assert.Equal(t, middleware.StateAbsent, h.get(k).State, "a rejected claim writes nothing")
	tok := h.mustAcquire(k)
	for _, d := range []time.Duration{0, -time.Second} {
		assert.ErrorIs(t, h.Store.Renew(h.ctx, k, tok, d), middleware.ErrInvalidTTL, "renew %v", d)
		assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, d), middleware.ErrInvalidTTL, "complete %v", d)
		assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, d), middleware.ErrInvalidTTL, "fail %v", d)
	}
	_, err := h.Store.Claim(h.ctx, "", lease, nil)
	assert.ErrorIs(t, err, middleware.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Renew(h.ctx, "", tok, lease), middleware.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, "", tok, nil, lease), middleware.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, "", tok, lease), middleware.ErrEmptyKey)
	_, err = h.Store.Get(h.ctx, "")
	assert.ErrorIs(t, err, middleware.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Delete(h.ctx, ""), middleware.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, "", nil, lease), middleware.ErrEmptyToken)

	rec := h.get(k)
	assert.Equal(t, middleware.StateInProgress, rec.State, "rejected calls change nothing")
	assert.Equal(t, tok, rec.Token)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
