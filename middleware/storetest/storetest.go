package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Subject is one store under test.
type Subject struct {
	// Store is the store under test, fresh or shared: the suite's keys are
	// unique to each subtest.
	Store idempotency.Store
	// Advance moves the store's clock forward by d. Nil means the store keeps
	// real time, and the suite sleeps instead.
	Advance func(d time.Duration)
	// PutForeign writes a value of the given kind that is not a record of
	// the store's under key, the way a bug or another program would, so the
	// suite can check that every method answers ErrCorruptRecord and changes
	// nothing. Nil for a store that keeps no encoding anyone else could
	// write (memstore): the corrupt-record case then logs that it does not
	// apply, and checks nothing.
	PutForeign func(key string, kind Foreign) error
}

// Foreign is a kind of value that is not a record, for Subject.PutForeign.
type Foreign int

// The foreign values of the corrupt-record case.
const (
	// ForeignShortString is a short string, such as "1".
	ForeignShortString Foreign = iota
	// ForeignLongString is a string longer than any record header.
	ForeignLongString
	// ForeignJSON is a JSON document.
	ForeignJSON
	// ForeignWrongType is a value of a type the store never uses for a
	// record (a Redis list, say).
	ForeignWrongType
	// ForeignBadFields is a value of the record's own type whose fields do
	// not parse (a Redis hash with a non-numeric attempt count, say).
	ForeignBadFields
)

// Foreigns lists every Foreign kind.
var Foreigns = []Foreign{ForeignShortString, ForeignLongString, ForeignJSON, ForeignWrongType, ForeignBadFields}

// String names the kind, for messages.
func (f Foreign) String() string {
	switch f {
	case ForeignShortString:
		return "short-string"
	case ForeignLongString:
		return "long-string"
	case ForeignJSON:
		return "json"
	case ForeignWrongType:
		return "wrong-type"
	case ForeignBadFields:
		return "bad-fields"
	default:
		return "foreign-" + strconv.Itoa(int(f))
	}
}

// lease is the lease of the suite's claims; long enough that scheduling noise
// on a loaded machine never expires one early, short enough to sleep through.
const lease = 300 * time.Millisecond

// past is how far the suite moves time to be sure a lease or TTL has expired.
const past = lease + 100*time.Millisecond

// ttl is the TTL of the suite's records: how long a COMPLETED or FAILED
// record is kept, and how long a claim's record outlives its lapsed lease.
const ttl = lease

// keyInMessage is how many leading bytes of a key an error must quote: a
// store may shorten a long key in its messages, but must name it.
const keyInMessage = 40

// Run runs the conformance suite against the stores that newStore returns,
// one per subtest. Subtests run in parallel.
func Run(t *testing.T, newStore func(t *testing.T) Subject) {
	run := randomHex(8)
	for _, tc := range append(cases[:len(cases):len(cases)], onceCases...) {
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

// request returns the suite's claim request, with a fresh token.
func request(fp []byte) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: lease, TTL: ttl, Fingerprint: fp}
}

func (h *harness) claimWith(key string, req idempotency.ClaimRequest) idempotency.ClaimResult {
	h.t.Helper()
	res, err := h.Store.Claim(h.ctx, key, req)
	require.NoError(h.t, err)
	if res.Acquired {
		require.Equal(h.t, req.Token, res.Record.Token, "an acquired record carries the claim's token")
		require.Equal(h.t, idempotency.StateInProgress, res.Record.State)
	}
	return res
}

// claim claims key with a fresh token.
func (h *harness) claim(key string, fp []byte) idempotency.ClaimResult {
	h.t.Helper()
	return h.claimWith(key, request(fp))
}

// mustAcquire claims key with a fresh token, which it returns.
func (h *harness) mustAcquire(key string) string {
	h.t.Helper()
	req := request(nil)
	res := h.claimWith(key, req)
	require.True(h.t, res.Acquired, "claim of %q must acquire, record %+v", key, res.Record)
	return req.Token
}

func (h *harness) get(key string) idempotency.Record {
	h.t.Helper()
	rec, err := h.Store.Get(h.ctx, key)
	require.NoError(h.t, err)
	return rec
}

// storeNow returns the current time of the store's clock (for Redis, the
// server's), which the suite cannot read directly: the UpdatedAt of a claim
// of a fresh key.
func (h *harness) storeNow() time.Time {
	h.t.Helper()
	res := h.claim(h.key("now:"+randomHex(4)), nil)
	require.True(h.t, res.Acquired)
	return res.Record.UpdatedAt
}

// assertLapsed checks that rec reads as a lease that lapsed: FAILED, without
// a token, with its attempts, and with a lease deadline that has passed.
func (h *harness) assertLapsed(rec idempotency.Record, attempts int, what string) {
	h.t.Helper()
	assert.Equal(h.t, idempotency.StateFailed, rec.State, "%s: a lapsed lease reads as FAILED: the attempt failed", what)
	assert.Empty(h.t, rec.Token, "%s: a lapsed lease has no owner", what)
	assert.Equal(h.t, attempts, rec.Attempts, "%s: a lapsed lease keeps its attempts", what)
	assert.Nil(h.t, rec.Result, what)
	require.False(h.t, rec.LeaseExpiresAt.IsZero(), "%s: a lapsed lease keeps its deadline", what)
	assert.False(h.t, rec.LeaseExpiresAt.After(h.storeNow()), "%s: the lapsed deadline %v is past", what, rec.LeaseExpiresAt)
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
	{"LapsedLeaseKeepsAttempts", testLapsedLease},
	{"FailCountsAttempts", testFailAttempts},
	{"ResentTransitionsAreIdempotent", testResent},
	{"ReleaseUndoesAClaim", testRelease},
	{"CompletedExpires", testCompletedExpires},
	{"FailedExpires", testFailedExpires},
	{"OddKeys", testOddKeys},
	{"Fingerprint", testFingerprint},
	{"CorruptRecords", testCorrupt},
	{"Delete", testDelete},
	{"CancelledContext", testCancelledContext},
	{"BadArguments", testBadArguments},
}

func testClaimAbsent(h *harness) {
	t, k := h.t, h.key("k")
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State)
	req := request(nil)
	res := h.claimWith(k, req)
	require.True(t, res.Acquired)
	assert.Equal(t, req.Token, res.Record.Token, "the record carries the claim's own token")
	assert.Equal(t, idempotency.StateInProgress, res.Record.State)
	assert.Equal(t, 1, res.Record.Attempts)
	assert.False(t, res.Record.CreatedAt.IsZero())
	assert.False(t, res.Record.UpdatedAt.Before(res.Record.CreatedAt))
	assert.WithinDuration(t, res.Record.UpdatedAt.Add(lease), res.Record.LeaseExpiresAt, lease/10,
		"the lease ends lease after the claim, by the store's clock")
	assert.True(t, res.Record.LeaseExpiresAt.After(h.storeNow()), "a fresh lease ends in the future")

	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State)
	assert.Equal(t, req.Token, rec.Token)
	assert.Equal(t, 1, rec.Attempts)
	assert.Nil(t, rec.Result)
	assert.WithinDuration(t, res.Record.LeaseExpiresAt, rec.LeaseExpiresAt, time.Millisecond, "Get reads the claim's deadline")
}

func testClaimRace(h *harness) {
	const claimers, rounds = 64, 100
	for round := range rounds {
		k := h.key("race:" + string(rune('a'+round%26)) + randomHex(4))
		var wins atomic.Int32
		var winner atomic.Value
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, claimers)
		for range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: time.Minute, TTL: time.Minute}
				<-start
				res, err := h.Store.Claim(h.ctx, k, req)
				if err != nil {
					errs <- err
					return
				}
				if res.Acquired {
					wins.Add(1)
					winner.Store(req.Token)
				} else if res.Record.State != idempotency.StateInProgress || res.Record.Token != "" {
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
		require.Equal(h.t, winner.Load(), h.get(k).Token, "round %d: the key is held by the winner's token", round)
	}
}

func testClaimInProgress(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	res := h.claim(k, nil)
	assert.False(t, res.Acquired)
	assert.Equal(t, idempotency.StateInProgress, res.Record.State)
	assert.Empty(t, res.Record.Token, "another owner's token is never handed out by Claim")
	assert.True(t, res.Record.LeaseExpiresAt.After(res.Record.UpdatedAt), "a live lease ends after its claim")
	assert.Equal(t, tok, h.get(k).Token, "a refused claim changes nothing")
}

func testComplete(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, []byte("output"), time.Minute))

	rec := h.get(k)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Empty(t, rec.Token)
	assert.Equal(t, []byte("output"), rec.Result)
	assert.Equal(t, 1, rec.Attempts)
	assert.False(t, rec.UpdatedAt.Before(rec.CreatedAt))
	assert.True(t, rec.LeaseExpiresAt.IsZero(), "a COMPLETED record has no lease")

	res := h.claim(k, nil)
	assert.False(t, res.Acquired, "a COMPLETED key is never claimed again")
	assert.Equal(t, idempotency.StateCompleted, res.Record.State)
	assert.Equal(t, []byte("output"), res.Record.Result, "the duplicate's claim returns the result")

	other := idempotency.NewToken()
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, other, []byte("again"), time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, other, time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, time.Minute), idempotency.ErrLeaseLost, "a completed key is not failed, even by its owner")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, tok, time.Minute), idempotency.ErrLeaseLost)
	rec = h.get(k)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, []byte("output"), rec.Result, "another Complete changes nothing")
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
		// A long lease: this test is about results, and writing 1 MiB on a
		// loaded machine (under the race detector) can take most of a short
		// one.
		req := request(nil)
		req.Lease = time.Minute
		require.True(h.t, h.claimWith(k, req).Acquired)
		require.NoError(h.t, h.Store.Complete(h.ctx, k, req.Token, result, time.Minute))
		for _, rec := range []idempotency.Record{h.get(k), h.claim(k, nil).Record} {
			require.NotNil(h.t, rec.Result, "%s: a completed record's result is non-nil", name)
			require.True(h.t, bytes.Equal(result, rec.Result), "%s: result of %d bytes came back as %d bytes", name, len(result), len(rec.Result))
		}
	}
}

func testStaleOwner(h *harness) {
	t, k, k2 := h.t, h.key("k"), h.key("k2")
	stale := h.mustAcquire(k)
	lapsed := h.mustAcquire(k2)
	h.advance(past)

	fresh := request(nil)
	res := h.claimWith(k, fresh)
	require.True(t, res.Acquired, "a lapsed lease is claimable")
	assert.Equal(t, 2, res.Record.Attempts, "the lapsed lease counted as an attempt")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, stale, lease), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, stale, []byte("stale"), time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, stale, time.Minute), idempotency.ErrLeaseLost)
	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "a stale owner changes nothing")
	assert.Equal(t, fresh.Token, rec.Token)
	assert.Equal(t, 2, rec.Attempts)
	require.NoError(t, h.Store.Complete(h.ctx, k, fresh.Token, []byte("fresh"), time.Minute))
	assert.Equal(t, []byte("fresh"), h.get(k).Result)

	// A stale owner whose key nobody claimed again is fenced as well: its
	// lease lapsed, whoever comes next.
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k2, lapsed, nil, time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k2, lapsed, lease), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k2, lapsed, time.Minute), idempotency.ErrLeaseLost)
	h.assertLapsed(h.get(k2), 1, "stale owner's key")
}

func testRenew(h *harness) {
	t, k := h.t, h.key("k")
	// A lease of its own, renewed every quarter of it: a loaded CI machine
	// (the race detector, every package's tests at once) has stalled a
	// renewal past a 300 ms lease, and a renewal that comes too late is
	// what this test must never mistake for one that does not extend.
	const renewLease = time.Second
	req := request(nil)
	req.Lease = renewLease
	require.True(t, h.claimWith(k, req).Acquired)
	tok := req.Token
	for range 9 {
		h.advance(renewLease / 4)
		require.NoError(t, h.Store.Renew(h.ctx, k, tok, renewLease))
	}
	// More than twice the lease has passed since the claim; renewals kept
	// it alive.
	assert.False(t, h.claim(k, nil).Acquired, "a renewed lease is not claimable")
	require.NoError(t, h.Store.Renew(h.ctx, k, tok, 4*renewLease), "renew may lengthen the lease")
	h.advance(renewLease + past - lease)
	assert.False(t, h.claim(k, nil).Acquired, "the lengthened lease holds past the original one")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, "not-the-owner", lease), idempotency.ErrLeaseLost)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute))
}

func testLeaseExpiry(h *harness) {
	t, k := h.t, h.key("k")
	h.mustAcquire(k)
	h.advance(lease / 3)
	assert.False(t, h.claim(k, nil).Acquired, "a live lease is not claimable")
	h.advance(past - lease/3)
	h.assertLapsed(h.get(k), 1, "lapsed lease")
	res := h.claim(k, nil)
	assert.True(t, res.Acquired, "a lapsed lease is claimable")
	assert.Equal(t, 2, res.Record.Attempts)
}

// testLapsedLease follows two keys on one timeline (times for the real
// clock; each step leaves at least 100ms either side of a deadline):
//
//	  0ms  claim k (attempt 1, lease to 300, record to 600); claim r
//	200ms  renew r (lease to 500)
//	400ms  renew r (lease to 700, record to 1000); k lapsed: FAILED,
//	       claim k (attempt 2, lease to 700, record to 1000)
//	800ms  r lapsed, and still there although its claim's record would
//	       have gone at 600; k lapsed again: claim k (attempt 3, record to 1400)
//	1500ms k and r gone; claim k is attempt 1
func testLapsedLease(h *harness) {
	t, k, r := h.t, h.key("k"), h.key("renewed")
	first := h.claim(k, nil)
	require.True(t, first.Acquired)
	rreq := request(nil)
	claimedR := h.claimWith(r, rreq)
	require.True(t, claimedR.Acquired)

	h.advance(lease * 2 / 3)
	require.NoError(t, h.Store.Renew(h.ctx, r, rreq.Token, lease))
	h.advance(lease * 2 / 3)
	require.NoError(t, h.Store.Renew(h.ctx, r, rreq.Token, lease))

	rec := h.get(k)
	h.assertLapsed(rec, 1, "first lapse")
	assert.WithinDuration(t, first.Record.LeaseExpiresAt, rec.LeaseExpiresAt, time.Millisecond, "the lapsed deadline is the claim's")
	assert.True(t, rec.CreatedAt.Equal(first.Record.CreatedAt))
	second := h.claim(k, nil)
	require.True(t, second.Acquired, "a lapsed lease is claimable")
	assert.Equal(t, 2, second.Record.Attempts, "the lapsed lease counted as an attempt")
	assert.True(t, second.Record.CreatedAt.Equal(first.Record.CreatedAt), "a new attempt keeps the record's creation time")
	assert.True(t, second.Record.LeaseExpiresAt.After(rec.LeaseExpiresAt), "a new attempt has a new lease")

	h.advance(past)
	rec = h.get(r)
	h.assertLapsed(rec, 1, "renewed lease, lapsed")
	assert.True(t, rec.LeaseExpiresAt.After(claimedR.Record.LeaseExpiresAt), "renewals moved the deadline")
	rec = h.get(k)
	h.assertLapsed(rec, 2, "second lapse")
	assert.WithinDuration(t, second.Record.LeaseExpiresAt, rec.LeaseExpiresAt, time.Millisecond)
	third := h.claim(k, nil)
	require.True(t, third.Acquired)
	assert.Equal(t, 3, third.Record.Attempts, "every lapsed lease counts: a crash loop reaches MaxAttempts")

	h.advance(lease + ttl + 100*time.Millisecond)
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "a lapsed record expires TTL after its deadline")
	assert.Equal(t, idempotency.StateAbsent, h.get(r).State, "and so does a renewed one")
	res := h.claim(k, nil)
	require.True(t, res.Acquired)
	assert.Equal(t, 1, res.Record.Attempts, "attempts restart only when the record itself expired")
}

func testFailAttempts(h *harness) {
	t, k := h.t, h.key("k")
	for attempt := 1; attempt <= 3; attempt++ {
		req := request(nil)
		res := h.claimWith(k, req)
		require.True(t, res.Acquired, "a FAILED key is claimable (attempt %d)", attempt)
		assert.Equal(t, attempt, res.Record.Attempts)
		require.NoError(t, h.Store.Fail(h.ctx, k, req.Token, time.Minute))
		rec := h.get(k)
		assert.Equal(t, idempotency.StateFailed, rec.State)
		assert.Equal(t, attempt, rec.Attempts)
		assert.Empty(t, rec.Token)
		assert.True(t, rec.LeaseExpiresAt.IsZero(), "a record failed by its owner has no lease")
		assert.ErrorIs(t, h.Store.Renew(h.ctx, k, req.Token, lease), idempotency.ErrLeaseLost, "fail ends the lease")
	}
	req := request(nil)
	require.True(t, h.claimWith(k, req).Acquired)
	require.NoError(t, h.Store.Complete(h.ctx, k, req.Token, []byte("ok"), time.Minute))
	rec := h.get(k)
	assert.Equal(t, 4, rec.Attempts, "attempts survive completion")
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// testResent resends every transition the way a client does when the reply
// of its first try was lost.
func testResent(h *harness) {
	t, k := h.t, h.key("completed")
	req := request(nil)
	first := h.claimWith(k, req)
	require.True(t, first.Acquired)
	h.advance(lease / 3)
	again := h.claimWith(k, req)
	require.True(t, again.Acquired, "a claim resent with the token that holds the key acquires it")
	assert.Equal(t, 1, again.Record.Attempts, "a resent claim counts no attempt")
	assert.True(t, again.Record.CreatedAt.Equal(first.Record.CreatedAt))
	assert.True(t, again.Record.LeaseExpiresAt.After(first.Record.LeaseExpiresAt), "a resent claim counts its lease from now")
	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State)
	assert.Equal(t, req.Token, rec.Token)
	assert.Equal(t, 1, rec.Attempts)

	require.NoError(t, h.Store.Renew(h.ctx, k, req.Token, lease))
	require.NoError(t, h.Store.Renew(h.ctx, k, req.Token, lease), "a resent renewal succeeds")
	require.NoError(t, h.Store.Complete(h.ctx, k, req.Token, []byte("first"), time.Minute))
	require.NoError(t, h.Store.Complete(h.ctx, k, req.Token, []byte("second"), time.Minute),
		"a Complete resent by the owner whose Complete was applied succeeds")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, []byte("first"), rec.Result, "a resent Complete changes nothing")
	assert.Equal(t, 1, rec.Attempts)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, idempotency.NewToken(), []byte("other"), time.Minute), idempotency.ErrLeaseLost,
		"only the completing token's resend succeeds")
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, req.Token, time.Minute), idempotency.ErrLeaseLost, "the completing token cannot fail it")
	res := h.claimWith(k, req)
	assert.False(t, res.Acquired, "COMPLETED is terminal, even for a claim with the completing token")
	assert.Equal(t, idempotency.StateCompleted, res.Record.State)
	assert.Empty(t, res.Record.Token)
	assert.Equal(t, []byte("first"), res.Record.Result)
	assert.Equal(t, []byte("first"), h.get(k).Result)

	k = h.key("failed")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Fail(h.ctx, k, tok, time.Minute))
	require.NoError(t, h.Store.Fail(h.ctx, k, tok, time.Minute), "a Fail resent by its owner succeeds")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateFailed, rec.State)
	assert.Equal(t, 1, rec.Attempts)
	assert.Empty(t, rec.Token, "the failing token is never reported")
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute), idempotency.ErrLeaseLost, "a failed owner cannot complete")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, tok, lease), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, idempotency.NewToken(), time.Minute), idempotency.ErrLeaseLost, "only the failing token's resend succeeds")
	next := request(nil)
	require.True(t, h.claimWith(k, next).Acquired)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, time.Minute), idempotency.ErrLeaseLost,
		"a Fail resent after the key was claimed again is stale")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "a stale resent Fail changes nothing")
	assert.Equal(t, next.Token, rec.Token)
	assert.Equal(t, 2, rec.Attempts)

	// The token that failed a key holds nothing: its own claim is a new
	// attempt, not a resend.
	k = h.key("reclaimed")
	req = request(nil)
	require.True(t, h.claimWith(k, req).Acquired)
	require.NoError(t, h.Store.Fail(h.ctx, k, req.Token, time.Minute))
	res = h.claimWith(k, req)
	require.True(t, res.Acquired, "a FAILED key is claimable")
	assert.Equal(t, 2, res.Record.Attempts, "a claim of a FAILED key counts an attempt, whatever its token")
}

// testRelease undoes claims whose outcome their caller never learned: the
// key goes back to what the claim found, and only a live lease of the
// releasing token is undone.
func testRelease(h *harness) {
	t := h.t
	assert.NoError(t, h.Store.Release(h.ctx, h.key("absent"), idempotency.NewToken()), "releasing an absent key is a no-op")
	assert.Equal(t, idempotency.StateAbsent, h.get(h.key("absent")).State)

	// A first attempt released: the key is gone, as the claim found it.
	k := h.key("first")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Release(h.ctx, k, idempotency.NewToken()), "another token's Release is a no-op")
	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "another token's Release changes nothing")
	assert.Equal(t, tok, rec.Token)
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "a released first attempt leaves no record")
	require.NoError(t, h.Store.Release(h.ctx, k, tok), "a resent Release succeeds")
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, []byte("late"), time.Minute), idempotency.ErrLeaseLost,
		"the released owner holds nothing")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, tok, lease), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, time.Minute), idempotency.ErrLeaseLost)
	next := request(nil)
	res := h.claimWith(k, next)
	require.True(t, res.Acquired)
	assert.Equal(t, 1, res.Record.Attempts, "the released claim counted no attempt")
	require.NoError(t, h.Store.Release(h.ctx, k, tok), "a Release resent after the key was claimed again is a no-op")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "a stale Release changes nothing")
	assert.Equal(t, next.Token, rec.Token)

	// A later attempt released: FAILED again, with the attempts it had.
	k = h.key("failed")
	failer := request([]byte("fp"))
	first := h.claimWith(k, failer)
	require.True(t, first.Acquired)
	require.NoError(t, h.Store.Fail(h.ctx, k, failer.Token, time.Minute))
	tok = h.mustAcquire(k)
	require.Equal(t, 2, h.get(k).Attempts)
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	rec = h.get(k)
	assert.Equal(t, idempotency.StateFailed, rec.State, "a released later attempt is FAILED again")
	assert.Equal(t, 1, rec.Attempts, "the released claim counted no attempt")
	assert.Empty(t, rec.Token)
	assert.True(t, rec.LeaseExpiresAt.IsZero(), "a released claim leaves no lease")
	assert.True(t, rec.CreatedAt.Equal(first.Record.CreatedAt), "the record keeps its creation time")
	assert.Equal(t, []byte("fp"), rec.Fingerprint, "and its fingerprint")
	require.NoError(t, h.Store.Release(h.ctx, k, tok), "a resent Release succeeds")
	require.NoError(t, h.Store.Release(h.ctx, k, idempotency.NewToken()), "another token's Release of a FAILED key is a no-op")
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute), idempotency.ErrLeaseLost, "the released owner holds nothing")
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, time.Minute), idempotency.ErrLeaseLost, "the released owner cannot fail")
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, failer.Token, time.Minute), idempotency.ErrLeaseLost,
		"the key was claimed since the first Fail: its resend is stale")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateFailed, rec.State, "none of them changed anything")
	assert.Equal(t, 1, rec.Attempts)
	res = h.claim(k, nil)
	require.True(t, res.Acquired, "a released key is claimable again")
	assert.Equal(t, 2, res.Record.Attempts, "as the attempt the released claim was")

	// A COMPLETED key is never released, even by the token that completed it.
	k = h.key("completed")
	tok = h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, []byte("done"), time.Minute))
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	rec = h.get(k)
	assert.Equal(t, idempotency.StateCompleted, rec.State, "Release of a COMPLETED key changes nothing")
	assert.Equal(t, []byte("done"), rec.Result)

	// A lease that lapsed is not released: its attempt ran, or may have.
	k = h.key("lapsed")
	tok = h.mustAcquire(k)
	h.advance(past)
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	h.assertLapsed(h.get(k), 1, "released after its lease lapsed")
	res = h.claim(k, nil)
	require.True(t, res.Acquired)
	assert.Equal(t, 2, res.Record.Attempts, "the lapsed attempt still counts")

	// A released later attempt is kept for its claim's TTL from the
	// release, not for what was left of the Fail's.
	k = h.key("expires")
	tok = h.mustAcquire(k)
	require.NoError(t, h.Store.Fail(h.ctx, k, tok, time.Minute))
	tok = h.mustAcquire(k)
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	require.Equal(t, idempotency.StateFailed, h.get(k).State)
	h.advance(past)
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "a released record expires the claim's TTL after the release")
}

func testCompletedExpires(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, []byte("r"), ttl))
	h.advance(ttl / 3)
	assert.Equal(t, idempotency.StateCompleted, h.get(k).State)
	h.advance(past)
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State)
	res := h.claim(k, nil)
	assert.True(t, res.Acquired)
	assert.Equal(t, 1, res.Record.Attempts)
}

func testFailedExpires(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Fail(h.ctx, k, tok, ttl))
	h.advance(past)
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State)
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
		assert.Equal(h.t, idempotency.StateCompleted, rec.State, name)
		assert.Equal(h.t, []byte(name), rec.Result, name)
		if name != "nul" && name != "1MiB" {
			// A key must be stored as itself: a truncating store would make
			// these two collide.
			assert.Equal(h.t, idempotency.StateAbsent, h.get(h.prefix+suffix[:len(suffix)-1]).State, name)
		}
	}
	a, b := h.key("x\x00y"), h.key("x\x00z")
	h.mustAcquire(a)
	h.mustAcquire(b) // keys differing after a NUL are different keys
}

func testFingerprint(h *harness) {
	t, k := h.t, h.key("k")
	fpA, fpB := []byte("sha256:A\x00\xff"), []byte("sha256:B")
	owner := request(fpA)
	res := h.claimWith(k, owner)
	require.True(t, res.Acquired)
	assert.Equal(t, fpA, res.Record.Fingerprint)

	other := h.claim(k, fpB)
	assert.False(t, other.Acquired)
	assert.Equal(t, fpA, other.Record.Fingerprint, "the stored fingerprint comes back to tell a reused key")

	require.NoError(t, h.Store.Fail(h.ctx, k, owner.Token, time.Minute))
	other = h.claim(k, fpB)
	assert.False(t, other.Acquired, "a different fingerprint never acquires, even a FAILED key")
	assert.Equal(t, idempotency.StateFailed, other.Record.State)
	assert.Equal(t, fpA, other.Record.Fingerprint)

	again := request(nil)
	res = h.claimWith(k, again)
	require.True(t, res.Acquired, "no fingerprint given: no comparison")
	assert.Equal(t, fpA, res.Record.Fingerprint, "the first fingerprint is kept")
	assert.Equal(t, 2, res.Record.Attempts)
	require.NoError(t, h.Store.Complete(h.ctx, k, again.Token, []byte("r"), time.Minute))

	same := h.claim(k, fpA)
	assert.False(t, same.Acquired)
	assert.Equal(t, idempotency.StateCompleted, same.Record.State)
	assert.Equal(t, fpA, same.Record.Fingerprint)
	assert.Equal(t, fpA, h.get(k).Fingerprint)
}

// testCorrupt puts values that are not records under keys and checks that
// every method refuses them with ErrCorruptRecord naming the key: never a
// duplicate, never an overwrite, never a panic; Delete clears them.
func testCorrupt(h *harness) {
	t := h.t
	if h.PutForeign == nil {
		t.Log("Subject.PutForeign is nil: the store keeps no encoding another program could write, so corrupt records do not apply")
		return
	}
	for _, kind := range Foreigns {
		k := h.key("foreign:" + kind.String())
		require.NoError(t, h.PutForeign(k, kind), kind)
		corrupt := func(op string, err error) {
			t.Helper()
			if assert.ErrorIs(t, err, idempotency.ErrCorruptRecord, "%v: %s", kind, op) {
				assert.Contains(t, err.Error(), k[:min(len(k), keyInMessage)], "%v: %s: the error names the key", kind, op)
			}
		}
		req := request(nil)
		res, err := h.Store.Claim(h.ctx, k, req)
		corrupt("claim", err)
		assert.False(t, res.Acquired, "%v: a corrupt record is never acquired over", kind)
		assert.NotEqual(t, idempotency.StateCompleted, res.Record.State, "%v: a corrupt record is never a duplicate", kind)
		_, err = h.Store.Get(h.ctx, k)
		corrupt("get", err)
		corrupt("renew", h.Store.Renew(h.ctx, k, req.Token, lease))
		corrupt("complete", h.Store.Complete(h.ctx, k, req.Token, []byte("r"), time.Minute))
		corrupt("fail", h.Store.Fail(h.ctx, k, req.Token, time.Minute))
		corrupt("release", h.Store.Release(h.ctx, k, req.Token))
		res, err = h.Store.Claim(h.ctx, k, request(nil))
		corrupt("claim after the others", err)
		assert.False(t, res.Acquired, "%v", kind)
		_, err = h.Store.Get(h.ctx, k)
		corrupt("get after the others: nothing overwrote the value", err)

		require.NoError(t, h.Store.Delete(h.ctx, k), "%v: Delete removes anything", kind)
		assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "%v", kind)
		assert.True(t, h.claim(k, nil).Acquired, "%v: a deleted corrupt key starts afresh", kind)
	}
}

func testDelete(h *harness) {
	t, k := h.t, h.key("k")
	require.NoError(t, h.Store.Delete(h.ctx, k), "deleting an absent key is fine")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Delete(h.ctx, k))
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute), idempotency.ErrLeaseLost)
	tok = h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute))
	require.NoError(t, h.Store.Delete(h.ctx, k))
	assert.True(t, h.claim(k, nil).Acquired, "a deleted COMPLETED key starts afresh")
}

func testCancelledContext(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := h.Store.Claim(ctx, h.key("other"), request(nil))
	assert.ErrorIs(t, err, context.Canceled, "claim")
	assert.ErrorIs(t, h.Store.Renew(ctx, k, tok, lease), context.Canceled, "renew")
	assert.ErrorIs(t, h.Store.Complete(ctx, k, tok, nil, time.Minute), context.Canceled, "complete")
	assert.ErrorIs(t, h.Store.Fail(ctx, k, tok, time.Minute), context.Canceled, "fail")
	assert.ErrorIs(t, h.Store.Release(ctx, k, tok), context.Canceled, "release")
	_, err = h.Store.Get(ctx, k)
	assert.ErrorIs(t, err, context.Canceled, "get")
	assert.ErrorIs(t, h.Store.Delete(ctx, k), context.Canceled, "delete")

	assert.Equal(t, idempotency.StateAbsent, h.get(h.key("other")).State, "a cancelled claim changes nothing")
	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "cancelled calls change nothing")
	assert.Equal(t, tok, rec.Token)
}

func testBadArguments(h *harness) {
	t, k := h.t, h.key("k")
	for _, d := range []time.Duration{0, -time.Second} {
		req := request(nil)
		req.Lease = d
		_, err := h.Store.Claim(h.ctx, k, req)
		assert.ErrorIs(t, err, idempotency.ErrInvalidTTL, "claim lease %v", d)
		req = request(nil)
		req.TTL = d
		_, err = h.Store.Claim(h.ctx, k, req)
		assert.ErrorIs(t, err, idempotency.ErrInvalidTTL, "claim ttl %v", d)
	}
	req := request(nil)
	req.Token = ""
	_, err := h.Store.Claim(h.ctx, k, req)
	assert.ErrorIs(t, err, idempotency.ErrEmptyToken, "claim")
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "a rejected claim writes nothing")
	tok := h.mustAcquire(k)
	for _, d := range []time.Duration{0, -time.Second} {
		assert.ErrorIs(t, h.Store.Renew(h.ctx, k, tok, d), idempotency.ErrInvalidTTL, "renew %v", d)
		assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, d), idempotency.ErrInvalidTTL, "complete %v", d)
		assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, d), idempotency.ErrInvalidTTL, "fail %v", d)
	}
	_, err = h.Store.Claim(h.ctx, "", request(nil))
	assert.ErrorIs(t, err, idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Renew(h.ctx, "", tok, lease), idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, "", tok, nil, lease), idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, "", tok, lease), idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Release(h.ctx, "", tok), idempotency.ErrEmptyKey)
	_, err = h.Store.Get(h.ctx, "")
	assert.ErrorIs(t, err, idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Delete(h.ctx, ""), idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, "", lease), idempotency.ErrEmptyToken)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, "", nil, lease), idempotency.ErrEmptyToken)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, "", lease), idempotency.ErrEmptyToken)
	assert.ErrorIs(t, h.Store.Release(h.ctx, k, ""), idempotency.ErrEmptyToken)

	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "rejected calls change nothing")
	assert.Equal(t, tok, rec.Token)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
