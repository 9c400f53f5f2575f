package redisstore_test

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// completed builds a COMPLETED string as codec.lua documents it.
func completed(attempts uint32, created, updated uint64, token string, fp, result []byte) []byte {
	v := []byte{0xC1}
	v = binary.BigEndian.AppendUint32(v, attempts)
	v = append(v, binary.BigEndian.AppendUint64(nil, created)[2:]...)
	v = append(v, binary.BigEndian.AppendUint64(nil, updated)[2:]...)
	sum := sha1.Sum([]byte(token))
	v = append(v, sum[:8]...)
	if len(fp) < 255 {
		v = append(v, byte(len(fp)))
	} else {
		v = binary.BigEndian.AppendUint32(append(v, 255), uint32(len(fp)))
	}
	return append(append(v, fp...), result...)
}

// pf builds an IN_PROGRESS or FAILED string as codec.lua documents it.
func pf(state byte, attempts uint32, created, updated, lease, retain uint64, owner string, fp []byte) []byte {
	v := []byte{0xC0, state}
	v = binary.BigEndian.AppendUint32(v, attempts)
	for _, t := range []uint64{created, updated, lease, retain} {
		v = append(v, binary.BigEndian.AppendUint64(nil, t)[2:]...)
	}
	v = binary.BigEndian.AppendUint32(v, uint32(len(owner)))
	v = append(v, owner...)
	v = binary.BigEndian.AppendUint32(v, uint32(len(fp)))
	return append(v, fp...)
}

// newStore is a store on the shared Redis, its client, and a key prefix of
// the test's own whose keys are deleted when the test ends.
func newStore(t *testing.T) (*redisstore.Store, *redis.Client, string) {
	t.Helper()
	client := testserver.RedisClient(t)
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	prefix := testserver.UniqueName("redisstore-test:") + ":"
	t.Cleanup(func() { unlinkPrefix(client, prefix) })
	return s, client, prefix
}

// TestCompletedEncoding pins the COMPLETED layout (the one documented in
// codec.lua and doc.go) and reports its memory.
func TestCompletedEncoding(t *testing.T) {
	s, client, prefix := newStore(t)
	ctx := context.Background()

	key := prefix + strings.Repeat("k", 48-len(prefix)) // a 48-byte key, as in doc.go
	req := claimReq(time.Minute, nil)
	_, err := s.Claim(ctx, key, req)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, key, req.Token, nil, time.Hour))
	raw, err := client.Get(ctx, key).Bytes()
	require.NoError(t, err)
	rec, err := s.Get(ctx, key)
	require.NoError(t, err)
	want := completed(1, uint64(rec.CreatedAt.UnixMilli()), uint64(rec.UpdatedAt.UnixMilli()), req.Token, nil, nil)
	assert.Equal(t, want, raw, "tag, attempts, created, updated, owner hash, fingerprint length, nothing else")
	mem, err := client.MemoryUsage(ctx, key).Result()
	require.NoError(t, err)
	t.Logf("MEMORY USAGE of a completed 48-byte key without output or fingerprint: %d bytes (value %d bytes)", mem, len(raw))
	// The layout before the owner hash was 18 bytes (136 B of MEMORY USAGE
	// for this key with jemalloc); the 8 more still fit the same allocation.
	oldKey := key[:len(key)-1] + "o"
	require.NoError(t, client.Set(ctx, oldKey, strings.Repeat("x", 18), time.Hour).Err())
	oldMem, err := client.MemoryUsage(ctx, oldKey).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, mem, oldMem, "a COMPLETED key costs no more memory than the 18-byte layout before it")

	// A long fingerprint takes the u32 length form, and round-trips.
	key = prefix + "long-fp"
	fp := []byte(strings.Repeat("f", 300))
	req = claimReq(time.Minute, fp)
	_, err = s.Claim(ctx, key, req)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, key, req.Token, []byte("out"), time.Hour))
	rec, err = s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, fp, rec.Fingerprint)
	assert.Equal(t, []byte("out"), rec.Result)
	raw, err = client.Get(ctx, key).Bytes()
	require.NoError(t, err)
	assert.Equal(t, completed(1, uint64(rec.CreatedAt.UnixMilli()), uint64(rec.UpdatedAt.UnixMilli()), req.Token, fp, []byte("out")), raw)

	// A record written by hand in the documented layout reads back.
	key = prefix + "by-hand"
	require.NoError(t, client.Set(ctx, key, completed(7, 1000, 2000, "tok", []byte("fp"), []byte("res")), time.Minute).Err())
	rec, err = s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.Record{State: idempotency.StateCompleted, Attempts: 7, Result: []byte("res"), Fingerprint: []byte("fp"),
		CreatedAt: time.UnixMilli(1000), UpdatedAt: time.UnixMilli(2000)}, rec)
	assert.NoError(t, s.Complete(ctx, key, "tok", nil, time.Minute), "the token whose hash is stored completed it")
	assert.ErrorIs(t, s.Complete(ctx, key, "other", nil, time.Minute), idempotency.ErrLeaseLost)
}

// TestCorruptRecords: every malformed value is ErrCorruptRecord from every
// method, never overwritten, and Delete removes it.
func TestCorruptRecords(t *testing.T) {
	s, client, prefix := newStore(t)
	ctx := context.Background()
	good := completed(1, 1000, 2000, "tok", []byte("fp"), nil)
	long := completed(1, 1000, 2000, "tok", []byte(strings.Repeat("f", 300)), nil)
	hash := func(fields ...string) func(key string) error {
		return func(key string) error { return client.HSet(ctx, key, fields).Err() }
	}
	str := func(v []byte) func(key string) error {
		return func(key string) error { return client.Set(ctx, key, v, 0).Err() }
	}
	live := func(fields ...string) func(key string) error {
		base := []string{"s", "P", "o", "tok", "a", "1", "c", "1", "u", "1", "l", "9" + strings.Repeat("9", 13), "r", "1000"}
		return hash(append(base, fields...)...)
	}
	cases := map[string]func(key string) error{
		"short string":           str([]byte("1")),
		"text":                   str([]byte(strings.Repeat("not a record, ", 8))),
		"json":                   str([]byte(`{"state":"completed","attempts":1}`)),
		"tag only":               str([]byte{0xC1}),
		"header one byte short":  str(good[:25]),
		"old layout":             str(append([]byte{'C', 0, 0, 0, 1, 0, 0, 0, 0, 3, 232, 0, 0, 0, 0, 7, 208, 0}, "result of twelve"...)),
		"unknown tag":            str(append([]byte{0xC2}, good[1:]...)),
		"fingerprint overruns":   str(good[:len(good)-1]),
		"long length cut":        str(long[:28]),
		"long length not needed": str(append(append(append([]byte{}, good[:25]...), 255, 0, 0, 0, 2), "fp"...)),
		"zero attempts":          str(completed(0, 1000, 2000, "tok", nil, nil)),
		"zero created":           str(completed(1, 0, 2000, "tok", nil, nil)),
		"updated before created": str(completed(1, 2000, 1000, "tok", nil, nil)),
		"list":                   func(key string) error { return client.RPush(ctx, key, "a").Err() },
		"set":                    func(key string) error { return client.SAdd(ctx, key, "a").Err() },
		// A HASH is another type, however well it would read as a record:
		// a live lease of "tok", a FAILED record, one without a state.
		"hash in progress":   live(),
		"hash failed":        hash("s", "F", "o", "tok", "a", "1", "c", "1", "u", "1"),
		"hash without state": hash("a", "1", "c", "1", "u", "1"),
		// The IN_PROGRESS and FAILED string, with "tok" as its owner where it
		// has one, so that Renew and Complete read it as theirs.
		"pf too short":                str(pf('P', 1, 1, 1, 1<<46, 1000, "tok", nil)[:37]),
		"pf bad state":                str(pf('C', 1, 1, 1, 1<<46, 1000, "tok", nil)),
		"pf owner overruns":           str(pf('P', 1, 1, 1, 1<<46, 1000, "tok", nil)[:39]),
		"pf fingerprint short":        str(pf('P', 1, 1, 1, 1<<46, 1000, "tok", []byte("fp"))[:41]),
		"pf trailing byte":            str(append(pf('P', 1, 1, 1, 1<<46, 1000, "tok", []byte("fp")), 0)),
		"pf zero attempts":            str(pf('P', 0, 1, 1, 1<<46, 1000, "tok", nil)),
		"pf zero created":             str(pf('P', 1, 0, 1, 1<<46, 1000, "tok", nil)),
		"pf updated before created":   str(pf('P', 1, 5, 4, 1<<46, 1000, "tok", nil)),
		"pf in progress no owner":     str(pf('P', 1, 1, 1, 1<<46, 1000, "", nil)),
		"pf in progress no lease":     str(pf('P', 1, 1, 1, 0, 1000, "tok", nil)),
		"pf in progress no retention": str(pf('P', 1, 1, 1, 1<<46, 0, "tok", nil)),
		"pf failed with a lease":      str(pf('F', 1, 1, 1, 1<<46, 0, "tok", nil)),
		"pf failed with a retention":  str(pf('F', 1, 1, 1, 0, 1000, "tok", nil)),
	}
	for name, put := range cases {
		t.Run(name, func(t *testing.T) {
			key := prefix + name
			require.NoError(t, put(key))
			before, err := client.Dump(ctx, key).Result()
			require.NoError(t, err)

			_, err = s.Claim(ctx, key, claimReq(time.Minute, nil))
			assert.ErrorIs(t, err, idempotency.ErrCorruptRecord, "claim")
			assert.ErrorContains(t, err, "redisstore: claim \""+key+"\": idempotency: corrupt record: ")
			assert.ErrorIs(t, s.Renew(ctx, key, "tok", time.Minute), idempotency.ErrCorruptRecord, "renew")
			assert.ErrorIs(t, s.Complete(ctx, key, "tok", nil, time.Minute), idempotency.ErrCorruptRecord, "complete")
			assert.ErrorIs(t, s.Fail(ctx, key, "tok", time.Minute), idempotency.ErrCorruptRecord, "fail")
			assert.ErrorIs(t, s.Release(ctx, key, "tok"), idempotency.ErrCorruptRecord, "release")
			_, err = s.Get(ctx, key)
			assert.ErrorIs(t, err, idempotency.ErrCorruptRecord, "get")
			t.Log(err)

			after, err := client.Dump(ctx, key).Result()
			require.NoError(t, err)
			assert.Equal(t, before, after, "a corrupt value is never overwritten")
			ttl, err := client.PTTL(ctx, key).Result()
			require.NoError(t, err)
			assert.Equal(t, time.Duration(-1), ttl, "nor given an expiry")

			require.NoError(t, s.Delete(ctx, key))
			rec, err := s.Get(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateAbsent, rec.State, "Delete removes a corrupt value")
		})
	}
}

// TestResentTransitions: each transition applied twice by its owner, on the
// store directly (the fault-injection test does it through a lost reply).
func TestResentTransitions(t *testing.T) {
	s, client, prefix := newStore(t)
	ctx := context.Background()

	key := prefix + "complete"
	req := claimReq(time.Minute, []byte("fp"))
	first, err := s.Claim(ctx, key, req)
	require.NoError(t, err)
	require.True(t, first.Acquired)
	req.Lease = 2 * time.Minute
	again, err := s.Claim(ctx, key, req)
	require.NoError(t, err)
	require.True(t, again.Acquired, "a resent claim acquires")
	assert.Equal(t, 1, again.Record.Attempts, "and counts no attempt")
	assert.Equal(t, req.Token, again.Record.Token)
	assert.WithinDuration(t, first.Record.CreatedAt, again.Record.CreatedAt, freshClaimTimes, "the resend keeps the creation time (the first claim reported the client's clock)")
	kept, err := s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, kept.CreatedAt, again.Record.CreatedAt, "the resend reports the creation time the record keeps")
	assert.True(t, again.Record.LeaseExpiresAt.After(first.Record.LeaseExpiresAt), "the lease counts from the resend")
	pttl, err := client.PTTL(ctx, key).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, 2*time.Minute, "the key lives for lease + TTL")

	other := claimReq(time.Minute, nil)
	refused, err := s.Claim(ctx, key, other)
	require.NoError(t, err)
	assert.False(t, refused.Acquired)
	assert.Empty(t, refused.Record.Token)

	require.NoError(t, s.Complete(ctx, key, req.Token, []byte("r"), time.Hour))
	require.NoError(t, s.Complete(ctx, key, req.Token, []byte("ignored"), time.Hour), "a resent Complete succeeds")
	assert.ErrorIs(t, s.Complete(ctx, key, other.Token, nil, time.Hour), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, s.Fail(ctx, key, req.Token, time.Hour), idempotency.ErrLeaseLost, "Fail after Complete")
	assert.ErrorIs(t, s.Renew(ctx, key, req.Token, time.Minute), idempotency.ErrCompletedByOwner, "the completing owner's Renew")
	assert.ErrorIs(t, s.Renew(ctx, key, other.Token, time.Minute), idempotency.ErrLeaseLost, "another token's Renew of a completed key")
	rec, err := s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, []byte("r"), rec.Result, "the resend changed nothing")

	key = prefix + "fail"
	req = claimReq(time.Minute, nil)
	_, err = s.Claim(ctx, key, req)
	require.NoError(t, err)
	require.NoError(t, s.Fail(ctx, key, req.Token, time.Hour))
	require.NoError(t, s.Fail(ctx, key, req.Token, time.Hour), "a resent Fail succeeds")
	assert.ErrorIs(t, s.Complete(ctx, key, req.Token, nil, time.Hour), idempotency.ErrLeaseLost, "Complete after Fail")
	assert.ErrorIs(t, s.Renew(ctx, key, req.Token, time.Minute), idempotency.ErrLeaseLost)
	rec, err = s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State)
	assert.Empty(t, rec.Token, "the failing token is kept but never shown")
	assert.True(t, rec.LeaseExpiresAt.IsZero())

	next := claimReq(time.Minute, nil)
	res, err := s.Claim(ctx, key, next)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	assert.Equal(t, 2, res.Record.Attempts)
	assert.ErrorIs(t, s.Fail(ctx, key, req.Token, time.Hour), idempotency.ErrLeaseLost, "claimed since: the old Fail is stale")
}

// TestLapsedLease: a lease that lapses leaves the record, read as FAILED
// with its deadline; the next claim counts one more attempt; the old owner
// is fenced.
func TestLapsedLease(t *testing.T) {
	s, client, prefix := newStore(t)
	ctx := context.Background()
	key := prefix + "lapsed"
	const lease = 200 * time.Millisecond
	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: lease, TTL: time.Minute, Fingerprint: []byte("fp")}
	first, err := s.Claim(ctx, key, req)
	require.NoError(t, err)
	require.True(t, first.Acquired)
	deadline := first.Record.LeaseExpiresAt
	require.False(t, deadline.IsZero())

	time.Sleep(lease + 100*time.Millisecond)
	rec, err := s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State, "a lapsed lease reads as FAILED")
	assert.Equal(t, 1, rec.Attempts)
	assert.Empty(t, rec.Token)
	assert.WithinDuration(t, deadline, rec.LeaseExpiresAt, freshClaimTimes, "the lapsed deadline is the claim's")
	assert.False(t, rec.LeaseExpiresAt.Before(deadline), "the server's lease ended no earlier than the client counted it")
	assert.Equal(t, []byte("fp"), rec.Fingerprint)
	pttl, err := client.PTTL(ctx, key).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, 30*time.Second, "the record outlives its lease by the claim's TTL")

	assert.ErrorIs(t, s.Renew(ctx, key, req.Token, lease), idempotency.ErrLeaseLost, "a lapsed lease is lost")
	assert.ErrorIs(t, s.Complete(ctx, key, req.Token, nil, time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, s.Fail(ctx, key, req.Token, time.Minute), idempotency.ErrLeaseLost)

	mismatch, err := s.Claim(ctx, key, claimReq(time.Minute, []byte("other")))
	require.NoError(t, err)
	assert.False(t, mismatch.Acquired)
	assert.Equal(t, idempotency.StateFailed, mismatch.Record.State)
	assert.Equal(t, rec.LeaseExpiresAt, mismatch.Record.LeaseExpiresAt, "the refusal reads the deadline Get read")

	next := claimReq(time.Minute, nil)
	res, err := s.Claim(ctx, key, next)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	assert.Equal(t, 2, res.Record.Attempts, "the lapsed attempt counts")
	assert.Equal(t, rec.CreatedAt, res.Record.CreatedAt, "the new attempt keeps the creation time Get read")
	assert.Equal(t, []byte("fp"), res.Record.Fingerprint)
	require.NoError(t, s.Complete(ctx, key, next.Token, nil, time.Minute))
	assert.ErrorIs(t, s.Complete(ctx, key, req.Token, nil, time.Minute), idempotency.ErrLeaseLost)
}

// TestReleasedEncoding pins what Release leaves: a first attempt's key is
// gone; a later attempt's string is FAILED with one attempt fewer, without
// owner, lease and retention, and expires the claim's TTL after the
// release. Such a record, without an owner, is valid.
func TestReleasedEncoding(t *testing.T) {
	s, client, prefix := newStore(t)
	ctx := context.Background()

	key := prefix + "first"
	req := claimReq(time.Minute, nil)
	_, err := s.Claim(ctx, key, req)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, key, req.Token))
	n, err := client.Exists(ctx, key).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a released first attempt deletes the key")

	key = prefix + "later"
	req = claimReq(time.Minute, []byte("fp"))
	_, err = s.Claim(ctx, key, req)
	require.NoError(t, err)
	// The created time the record keeps: the server's, which a plain claim
	// does not report (it reports the client's clock at the send).
	first, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.NoError(t, s.Fail(ctx, key, req.Token, time.Hour))
	req = idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: 30 * time.Second}
	_, err = s.Claim(ctx, key, req)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, key, req.Token))
	raw, err := client.Get(ctx, key).Bytes()
	require.NoError(t, err)
	require.Greater(t, len(raw), 18)
	updated := binary.BigEndian.Uint64(append([]byte{0, 0}, raw[12:18]...))
	assert.Equal(t, pf('F', 1, uint64(first.CreatedAt.UnixMilli()), updated, 0, 0, "", []byte("fp")), raw,
		"FAILED, one attempt fewer, created and fingerprint kept, no owner, lease or retention")
	pttl, err := client.PTTL(ctx, key).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, time.Duration(0))
	assert.LessOrEqual(t, pttl, 30*time.Second, "the key expires the claim's TTL after the release, not the Fail's hour")

	// The same record written by hand reads back, refuses every owner, and
	// is claimed as the next attempt.
	key = prefix + "by-hand"
	require.NoError(t, client.Set(ctx, key, pf('F', 3, 1000, 2000, 0, 0, "", nil), 0).Err())
	rec, err := s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.Record{State: idempotency.StateFailed, Attempts: 3,
		CreatedAt: time.UnixMilli(1000), UpdatedAt: time.UnixMilli(2000)}, rec)
	assert.ErrorIs(t, s.Fail(ctx, key, "tok", time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, s.Complete(ctx, key, "tok", nil, time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, s.Renew(ctx, key, "tok", time.Minute), idempotency.ErrLeaseLost)
	require.NoError(t, s.Release(ctx, key, "tok"))
	res, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
	require.NoError(t, err)
	assert.True(t, res.Acquired)
	assert.Equal(t, 4, res.Record.Attempts)
}

// TestInProgressEncoding pins the IN_PROGRESS string that a claim writes
// and a renewal rewrites.
func TestInProgressEncoding(t *testing.T) {
	s, client, prefix := newStore(t)
	ctx := context.Background()
	ms := func(at time.Time) uint64 { return uint64(at.UnixMilli()) }

	key := prefix + "fresh"
	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Hour, Fingerprint: []byte("fp")}
	res, err := s.Claim(ctx, key, req)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	assert.Equal(t, res.Record.CreatedAt, res.Record.UpdatedAt)
	assert.Equal(t, res.Record.CreatedAt.Add(time.Minute), res.Record.LeaseExpiresAt)
	raw, err := client.Get(ctx, key).Bytes()
	require.NoError(t, err)
	assert.Equal(t, pf('N', 1, 0, 0, uint64(time.Minute.Milliseconds()), uint64(time.Hour.Milliseconds()), req.Token, []byte("fp")), raw,
		"the plain claim's N record: tag, state, attempts, no times, lease length, retention, owner, fingerprint")
	pttl, err := client.PTTL(ctx, key).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, time.Hour, "the key outlives the lease by the retention")
	assert.LessOrEqual(t, pttl, time.Hour+time.Minute)
	expiry, err := client.PExpireTime(ctx, key).Result()
	require.NoError(t, err)
	rec, err := s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, time.UnixMilli(expiry.Milliseconds()).Add(-time.Hour), rec.LeaseExpiresAt, "the lease ends at the key's expiry less the retention")
	assert.Equal(t, rec.LeaseExpiresAt.Add(-time.Minute), rec.CreatedAt, "created a lease before that")
	assert.Equal(t, rec.CreatedAt, rec.UpdatedAt)
	sameClaim(t, "plain", res.Record, rec, "Get reads what the claim reported")

	time.Sleep(5 * time.Millisecond)
	require.NoError(t, s.Renew(ctx, key, req.Token, 2*time.Minute))
	renewed, err := client.Get(ctx, key).Bytes()
	require.NoError(t, err)
	got, err := s.Get(ctx, key)
	require.NoError(t, err)
	assert.True(t, got.LeaseExpiresAt.After(rec.LeaseExpiresAt.Add(time.Minute)), "the deadline moved to 2 minutes from the renewal")
	assert.Equal(t, pf('P', 1, ms(rec.CreatedAt), ms(rec.UpdatedAt), ms(got.LeaseExpiresAt), uint64(time.Hour.Milliseconds()), req.Token, []byte("fp")), renewed,
		"a renewal writes the P string: the N record's times, and the new deadline")
	pttl, err = client.PTTL(ctx, key).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, time.Hour+time.Minute, "and the key's expiry with it")
}
