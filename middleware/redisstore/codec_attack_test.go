package redisstore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strconv"
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

// The tests of this file attack the codec (codec.lua, and codec.go's
// decoding of the plain claim's reply): values that only the codec rejects,
// lost replies of the common paths, TTL clamps, odd keys and sizes. They run on a private Redis, whose count of writes
// (rdb_changes_since_last_save, persistence being off) shows that a call
// wrote nothing, and every claim is made on both paths: the plain SET NX
// GET and claim.lua.

// codecRedis is a private Redis with a store on it, and the same store
// claiming with claim.lua alone.
type codecRedis struct {
	client *redis.Client
	store  *redisstore.Store
	script *redisstore.Store
}

func startCodecRedis(t *testing.T, extraArgs ...string) *codecRedis {
	t.Helper()
	srv := testserver.StartRedis(t, extraArgs...)
	return newCodecRedis(t, srv.Addr)
}

func newCodecRedis(t *testing.T, addr string) *codecRedis {
	t.Helper()
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	r := &codecRedis{client: client}
	var err error
	r.store, err = redisstore.New(client, nil)
	require.NoError(t, err)
	r.script, err = redisstore.New(client, nil)
	require.NoError(t, err)
	redisstore.ClaimWithScriptOnly(r.script)
	loadScripts(t, r.store) // no call of a test meets NOSCRIPT
	return r
}

// claimers are the two paths of a claim.
func (r *codecRedis) claimers() map[string]*redisstore.Store {
	return map[string]*redisstore.Store{"plain": r.store, "script": r.script}
}

// claimedRaw is the string that a claim on path of an absent key leaves,
// rec being what the claim reported: the N record of the plain claim, the
// P record of claim.lua.
func claimedRaw(path string, rec idempotency.Record, lease, retain time.Duration, token string, fp []byte) []byte {
	if path == "plain" {
		return pf('N', 1, 0, 0, uint64(lease.Milliseconds()), uint64(retain.Milliseconds()), token, fp)
	}
	ms := func(at time.Time) uint64 { return uint64(at.UnixMilli()) }
	return pf('P', 1, ms(rec.CreatedAt), ms(rec.UpdatedAt), ms(rec.LeaseExpiresAt), uint64(retain.Milliseconds()), token, fp)
}

// sameClaim asserts that Get read (got) the record a fresh claim on path
// reported (claimed): the same, but for the plain claim's times, which are
// the client's clock at the send, a little behind the server's.
func sameClaim(t *testing.T, path string, claimed, got idempotency.Record, msg string) {
	t.Helper()
	if path == "plain" {
		assert.WithinDuration(t, claimed.CreatedAt, got.CreatedAt, freshClaimTimes, msg)
		assert.WithinDuration(t, claimed.UpdatedAt, got.UpdatedAt, freshClaimTimes, msg)
		assert.WithinDuration(t, claimed.LeaseExpiresAt, got.LeaseExpiresAt, freshClaimTimes, msg)
		assert.False(t, got.LeaseExpiresAt.Before(claimed.LeaseExpiresAt), "%s: the server's lease ends no earlier than the client counts it", msg)
		claimed.CreatedAt, claimed.UpdatedAt, claimed.LeaseExpiresAt = got.CreatedAt, got.UpdatedAt, got.LeaseExpiresAt
	}
	assert.Equal(t, claimed, got, msg)
}

// writes is the server's count of changes to its data: it stays the same
// across calls that wrote nothing (a SET NX that found the key, a refused
// transition), and grows by one per SET, PEXPIRE or DEL.
func writes(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "persistence").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "rdb_changes_since_last_save:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no rdb_changes_since_last_save in INFO persistence")
	return 0
}

// dump is a key's serialized value, "" when the key is absent.
func dump(t *testing.T, c *redis.Client, key string) string {
	t.Helper()
	v, err := c.Dump(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	require.NoError(t, err)
	return v
}

// untouched runs calls and checks that they left key as it was and wrote
// nothing at all.
func untouched(t *testing.T, c *redis.Client, key string, calls func()) {
	t.Helper()
	ctx := context.Background()
	before, n := dump(t, c, key), writes(t, c)
	// The key's expiry as a time (PEXPIRETIME), which stays the same to the
	// millisecond however long the calls take; -1 for none.
	expiry, err := c.PExpireTime(ctx, key).Result()
	require.NoError(t, err)
	calls()
	assert.Equal(t, before, dump(t, c, key), "the value is unchanged")
	assert.Equal(t, n, writes(t, c), "nothing was written")
	after, err := c.PExpireTime(ctx, key).Result()
	require.NoError(t, err)
	assert.Equal(t, expiry, after, "the expiry is unchanged (no expiry stays none)")
}

// corruptReason is what follows "corrupt record: " in err.
func corruptReason(t *testing.T, err error) string {
	t.Helper()
	require.ErrorIs(t, err, idempotency.ErrCorruptRecord)
	_, reason, ok := strings.Cut(err.Error(), "corrupt record: ")
	require.True(t, ok, err.Error())
	return reason
}

// cHeader is a COMPLETED header up to the owner hash (25 bytes), owned by
// "tok", with the fields given.
func cHeader(attempts uint32, created, updated uint64) []byte {
	return completed(attempts, created, updated, "tok", nil, nil)[:25]
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// TestCorruptValuesOnEveryPath writes values that the codec must refuse, or (a COMPLETED string that a claim
// returns) to the store's Go decoding: each is ErrCorruptRecord from every
// method, on both claim paths, with the token the value names, and nothing
// is written (not the value, not an expiry, nothing else); the reason a
// claim gives is the codec's, and Delete removes the value.
func TestCorruptValuesOnEveryPath(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	good := pf('P', 1, 1000, 2000, 1<<46, 60000, "tok", []byte("fp"))
	withOwnerLength := func(n uint32) []byte {
		v := bytes.Clone(good)
		binary.BigEndian.PutUint32(v[30:34], n)
		return v
	}
	withFingerprintLength := func(m uint32) []byte {
		v := bytes.Clone(good)
		binary.BigEndian.PutUint32(v[37:41], m)
		return v
	}
	str := func(v []byte) func(key string) error {
		return func(key string) error { return r.client.Set(ctx, key, v, 0).Err() }
	}
	// expiring writes v with the expiry a plain claim gives its N record.
	expiring := func(v []byte) func(key string) error {
		return func(key string) error { return r.client.Set(ctx, key, v, 2*time.Minute).Err() }
	}
	// The two "long" cases are longer than codec.lua's partial read (PEEK).
	cases := map[string]func(key string) error{
		"empty string":                          str(nil),
		"pf tag alone":                          str([]byte{0xC0}),
		"pf tag and state, 37 bytes":            str(append([]byte{0xC0, 'P'}, make([]byte, 35)...)),
		"pf header cut after the owner":         str(good[:37]),
		"pf fingerprint length cut":             str(good[:40]),
		"pf owner length u32 max":               str(withOwnerLength(math.MaxUint32)),
		"pf owner length 2^31":                  str(withOwnerLength(1 << 31)),
		"pf owner length one more":              str(withOwnerLength(4)),
		"pf owner length one less":              str(withOwnerLength(2)),
		"pf owner length zero":                  str(withOwnerLength(0)),
		"pf fingerprint length one more":        str(withFingerprintLength(3)),
		"pf fingerprint length one less":        str(withFingerprintLength(1)),
		"pf fingerprint length u32 max":         str(withFingerprintLength(math.MaxUint32)),
		"pf fingerprint length 2^31":            str(withFingerprintLength(1 << 31)),
		"pf lowercase state":                    str(append([]byte{0xC0, 'p'}, good[2:]...)),
		"pf completed state":                    str(append([]byte{0xC0, 'C'}, good[2:]...)),
		"pf zero attempts":                      str(pf('P', 0, 1000, 2000, 1<<46, 60000, "tok", nil)),
		"pf zero created":                       str(pf('P', 1, 0, 2000, 1<<46, 60000, "tok", nil)),
		"pf updated before created":             str(pf('P', 1, 2000, 1999, 1<<46, 60000, "tok", nil)),
		"pf zero lease":                         str(pf('P', 1, 1000, 2000, 0, 60000, "tok", nil)),
		"pf zero retention":                     str(pf('P', 1, 1000, 2000, 1<<46, 0, "tok", nil)),
		"pf failed with a lease":                str(pf('F', 1, 1000, 2000, 1<<46, 0, "tok", nil)),
		"pf failed with a retention, no owner":  str(pf('F', 1, 1000, 2000, 0, 1, "", nil)),
		"new without expiry":                    str(pf('N', 1, 0, 0, 60000, 60000, "tok", nil)),
		"new with times":                        expiring(pf('N', 1, 1000, 1000, 60000, 60000, "tok", nil)),
		"new with a created time":               expiring(pf('N', 1, 1000, 0, 60000, 60000, "tok", nil)),
		"new zero lease":                        expiring(pf('N', 1, 0, 0, 0, 60000, "tok", nil)),
		"new zero retention":                    expiring(pf('N', 1, 0, 0, 60000, 0, "tok", nil)),
		"new zero attempts":                     expiring(pf('N', 0, 0, 0, 60000, 60000, "tok", nil)),
		"new without owner":                     expiring(pf('N', 1, 0, 0, 60000, 60000, "", nil)),
		"new fingerprint length one more":       expiring(append(pf('N', 1, 0, 0, 60000, 60000, "tok", nil)[:37:37], 0, 0, 0, 1)),
		"completed 25 bytes":                    str(cHeader(1, 1000, 2000)),
		"completed 26 bytes, long length":       str(cat(cHeader(1, 1000, 2000), []byte{255})),
		"completed 29 bytes, long length":       str(cat(cHeader(1, 1000, 2000), []byte{255, 0, 0, 1})),
		"completed long length 254":             str(cat(cHeader(1, 1000, 2000), []byte{255, 0, 0, 0, 254}, make([]byte, 254))),
		"completed long length 0":               str(cat(cHeader(1, 1000, 2000), []byte{255, 0, 0, 0, 0})),
		"completed long length overruns":        str(cat(cHeader(1, 1000, 2000), []byte{255, 0, 0, 0, 255}, make([]byte, 254))),
		"completed long length u32 max":         str(cat(cHeader(1, 1000, 2000), []byte{255, 255, 255, 255, 255}, make([]byte, 300))),
		"completed fp overruns a long value":    str(cat(cHeader(1, 1000, 2000), []byte{255, 0, 0, 4, 0}, make([]byte, 1000))),
		"pf long, fp length one less":           str(cat(pf('P', 1, 1000, 2000, 1<<46, 60000, "tok", make([]byte, 600)), []byte("x"))),
		"completed 26 bytes, fingerprint of 1":  str(cat(cHeader(1, 1000, 2000), []byte{1})),
		"completed 26 bytes, zero attempts":     str(completed(0, 1000, 2000, "tok", nil, nil)),
		"completed 26 bytes, zero created":      str(completed(1, 0, 2000, "tok", nil, nil)),
		"completed 26 bytes, updated too early": str(completed(1, 2000, 1999, "tok", nil, nil)),
		"completed, updated too early, result":  str(completed(1, 2000, 1999, "tok", []byte("fp"), []byte("result"))),
		"completed tag then text":               str(append([]byte{0xC1}, strings.Repeat("x", 40)...)),
		"zset":                                  func(key string) error { return r.client.ZAdd(ctx, key, redis.Z{Score: 1, Member: "a"}).Err() },
		"list":                                  func(key string) error { return r.client.RPush(ctx, key, "\xC1").Err() },
		"set":                                   func(key string) error { return r.client.SAdd(ctx, key, "a").Err() },
		"text":                                  str([]byte(strings.Repeat("not a record, ", 8))),
		"integer":                               str([]byte("12345678901234567890123456789012345678")),
		"stream": func(key string) error {
			return r.client.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []string{"s", "P"}}).Err()
		},
	}
	// A HASH is another type, however well it would read as a record: a
	// live lease of "tok", a lapsed one, FAILED by "tok" or by a release,
	// without a state.
	live := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	for name, fields := range map[string][]string{
		"hash in progress":   {"s", "P", "o", "tok", "l", live, "r", "60000", "a", "2", "c", "1000", "u", "2000", "f", "fp"},
		"hash lapsed":        {"s", "P", "o", "tok", "l", "3000", "r", "60000", "a", "2", "c", "1000", "u", "2000"},
		"hash failed by tok": {"s", "F", "o", "tok", "a", "2", "c", "1000", "u", "2000"},
		"hash failed":        {"s", "F", "a", "2", "c", "1000", "u", "2000"},
		"hash without state": {"o", "tok", "a", "1", "c", "1", "u", "1"},
	} {
		cases[name] = func(key string) error { return r.client.HSet(ctx, key, fields).Err() }
	}
	for name, put := range cases {
		t.Run(name, func(t *testing.T) {
			key := "corrupt:" + name
			require.NoError(t, put(key))
			var reasons []string
			untouched(t, r.client, key, func() {
				_, err := r.store.Get(ctx, key)
				reasons = append(reasons, corruptReason(t, err))
				for path, s := range r.claimers() {
					for _, token := range []string{"tok", "other"} {
						_, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute})
						assert.ErrorIs(t, err, idempotency.ErrCorruptRecord, "claim on the %s path by %s", path, token)
						assert.ErrorContains(t, err, "redisstore: claim \""+key+"\": idempotency: corrupt record: ")
						if err != nil {
							reasons = append(reasons, corruptReason(t, err))
						}
					}
				}
				assert.ErrorIs(t, r.store.Renew(ctx, key, "tok", time.Minute), idempotency.ErrCorruptRecord, "renew")
				assert.ErrorIs(t, r.store.Complete(ctx, key, "tok", []byte("r"), time.Minute), idempotency.ErrCorruptRecord, "complete")
				assert.ErrorIs(t, r.store.Fail(ctx, key, "tok", time.Minute), idempotency.ErrCorruptRecord, "fail")
				assert.ErrorIs(t, r.store.Release(ctx, key, "tok"), idempotency.ErrCorruptRecord, "release")
			})
			for _, reason := range reasons[1:] {
				assert.Equal(t, reasons[0], reason, "a claim gives the reason Get gives")
			}
			t.Log(reasons[0])
			require.NoError(t, r.store.Delete(ctx, key))
			assert.Empty(t, dump(t, r.client, key), "Delete removes a corrupt value")
		})
	}
}

// TestCompletedStringsDecodedAlikeInGoAndLua writes valid COMPLETED strings
// at the edges of the layout: a claim, on either path, returns the string
// as it is and the store decodes it in Go; Get decodes it in Lua. The two
// records must be the same, field by field (an empty result as empty, not
// nil), whatever fingerprint the claim carries; nothing is written, and
// the owner's resent Complete and Renew are answered from the record.
func TestCompletedStringsDecodedAlikeInGoAndLua(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	const maxU48 = 1<<48 - 1
	big := bytes.Repeat([]byte{0xC1, 0, 'x', 0xFF}, 3<<18) // 3 MiB
	cases := map[string][]byte{
		"26 bytes":                        completed(1, 1000, 1000, "tok", nil, nil),
		"widest fields":                   completed(math.MaxUint32, maxU48, maxU48, "tok", nil, nil),
		"fingerprint of 254, short form":  completed(2, 1000, 2000, "tok", bytes.Repeat([]byte{255}, 254), []byte("r")),
		"fingerprint of 255, long form":   completed(2, 1000, 2000, "tok", bytes.Repeat([]byte{255}, 255), nil),
		"long form fills the value":       completed(2, 1000, 2000, "tok", bytes.Repeat([]byte{0}, 300), nil),
		"result of a few MB":              completed(3, 1000, 2000, "tok", []byte("fp"), big),
		"fingerprint of a few MB":         completed(3, 1000, 2000, "tok", big, []byte("r")),
		"result looks like a pf record":   completed(1, 1000, 2000, "tok", nil, pf('P', 1, 1, 1, 1, 1, "tok", nil)),
		"result is a completed string":    completed(1, 1000, 2000, "tok", []byte("fp"), completed(1, 1, 1, "x", nil, nil)),
		"fingerprint and result all 0xC1": completed(1, 1000, 2000, "tok", bytes.Repeat([]byte{0xC1}, 255), bytes.Repeat([]byte{0xC1}, 26)),
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			key := "completed:" + name
			require.NoError(t, r.client.Set(ctx, key, v, time.Hour).Err())
			untouched(t, r.client, key, func() {
				want, err := r.store.Get(ctx, key)
				require.NoError(t, err)
				require.Equal(t, idempotency.StateCompleted, want.State)
				require.NotNil(t, want.Result, "Get's result is never nil")
				for path, s := range r.claimers() {
					for _, fp := range [][]byte{nil, []byte("fp"), want.Fingerprint, []byte("other")} {
						res, err := s.Claim(ctx, key, claimReq(time.Minute, fp))
						require.NoError(t, err, path)
						assert.False(t, res.Acquired, path)
						assert.Equal(t, want, res.Record, "the claim on the %s path decodes as Get does", path)
					}
				}
				assert.NoError(t, r.store.Complete(ctx, key, "tok", []byte("other result"), time.Minute), "a resent Complete")
				assert.ErrorIs(t, r.store.Renew(ctx, key, "tok", time.Minute), idempotency.ErrCompletedByOwner)
				assert.ErrorIs(t, r.store.Complete(ctx, key, "other", nil, time.Minute), idempotency.ErrLeaseLost)
				assert.ErrorIs(t, r.store.Renew(ctx, key, "other", time.Minute), idempotency.ErrLeaseLost)
				assert.ErrorIs(t, r.store.Fail(ctx, key, "tok", time.Minute), idempotency.ErrLeaseLost)
				assert.NoError(t, r.store.Release(ctx, key, "tok"))
			})
		})
	}
}

// TestCommonPathsAtTheEdgesOfSizes claims, renews and completes through the
// common paths with fingerprints and results of 0 bytes, of 254 and 255
// (where the COMPLETED string's fingerprint length takes its long form) and
// of a few MB: each step leaves the documented bytes, and a later claim
// (decoded in Go) and Get (decoded in Lua) read the same record.
func TestCommonPathsAtTheEdgesOfSizes(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	ms := func(at time.Time) uint64 { return uint64(at.UnixMilli()) }
	few := bytes.Repeat([]byte{0, 0xC0, 0xC1, 'P'}, 1<<19) // 2 MiB
	sizes := map[string]struct{ fp, result []byte }{
		"empty":                   {nil, nil},
		"empty result, fp":        {[]byte("fp"), []byte{}},
		"fp of 254":               {bytes.Repeat([]byte("f"), 254), []byte("r")},
		"fp of 255":               {bytes.Repeat([]byte("f"), 255), []byte("r")},
		"fp of 256":               {bytes.Repeat([]byte("f"), 256), nil},
		"result of a few MB":      {[]byte("fp"), few},
		"fp of a few MB":          {few, []byte("r")},
		"both of a few MB":        {few, few},
		"fp of one byte 0xC1":     {[]byte{0xC1}, []byte{0xC0}},
		"result of 26 bytes 0xC1": {nil, bytes.Repeat([]byte{0xC1}, 26)},
	}
	for name, size := range sizes {
		for path, s := range r.claimers() {
			t.Run(name+"/"+path, func(t *testing.T) {
				key := "sizes:" + path + ":" + name
				req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Hour, Fingerprint: size.fp}
				n := writes(t, r.client)
				res, err := s.Claim(ctx, key, req)
				require.NoError(t, err)
				require.True(t, res.Acquired)
				assert.Equal(t, n+1, writes(t, r.client), "a fresh claim is one write")
				raw, err := r.client.Get(ctx, key).Bytes()
				require.NoError(t, err)
				assert.True(t, bytes.Equal(claimedRaw(path, res.Record, time.Minute, time.Hour, req.Token, size.fp), raw),
					"the claim's IN_PROGRESS string")
				rec, err := r.store.Get(ctx, key)
				require.NoError(t, err)
				sameClaim(t, path, res.Record, rec, "Get reads what the claim reported")

				n = writes(t, r.client)
				require.NoError(t, r.store.Renew(ctx, key, req.Token, 2*time.Minute))
				assert.Equal(t, n+1, writes(t, r.client), "a renewal is one write")
				renewed, err := r.store.Get(ctx, key)
				require.NoError(t, err)
				raw, err = r.client.Get(ctx, key).Bytes()
				require.NoError(t, err)
				assert.True(t, bytes.Equal(pf('P', 1, ms(rec.CreatedAt), ms(rec.UpdatedAt), ms(renewed.LeaseExpiresAt), uint64(time.Hour.Milliseconds()), req.Token, size.fp), raw),
					"the renewal moved the deadline alone")

				n = writes(t, r.client)
				require.NoError(t, r.store.Complete(ctx, key, req.Token, size.result, 3*time.Hour))
				assert.Equal(t, n+1, writes(t, r.client), "a completion is one write")
				done, err := r.store.Get(ctx, key)
				require.NoError(t, err)
				raw, err = r.client.Get(ctx, key).Bytes()
				require.NoError(t, err)
				assert.True(t, bytes.Equal(completed(1, ms(rec.CreatedAt), ms(done.UpdatedAt), req.Token, size.fp, size.result), raw),
					"the COMPLETED string")
				pttl, err := r.client.PTTL(ctx, key).Result()
				require.NoError(t, err)
				assert.Greater(t, pttl, 2*time.Hour)
				assert.LessOrEqual(t, pttl, 3*time.Hour)
				assert.True(t, bytes.Equal(size.fp, done.Fingerprint) && bytes.Equal(size.result, done.Result), "fingerprint and result kept")

				untouched(t, r.client, key, func() {
					dup, err := s.Claim(ctx, key, claimReq(time.Minute, size.fp))
					require.NoError(t, err)
					assert.False(t, dup.Acquired)
					assert.Equal(t, done, dup.Record, "the duplicate's claim reads what Get reads")
					require.NoError(t, r.store.Complete(ctx, key, req.Token, size.result, 3*time.Hour), "resent")
				})
			})
		}
	}
}

// lossyRedis is a private Redis seen through a proxy that can drop a
// script's reply after the script ran (go-redis then resends it), and
// directly.
type lossyRedis struct {
	*codecRedis // direct
	proxy       *testserver.Proxy
	lossy       *redisstore.Store
	lossyScript *redisstore.Store
}

func startLossyRedis(t *testing.T, opts redisstore.Options) *lossyRedis {
	t.Helper()
	srv := testserver.StartRedis(t)
	l := &lossyRedis{codecRedis: newCodecRedis(t, srv.Addr), proxy: testserver.StartProxy(t, srv.Addr)}
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: l.proxy.Addr})
	t.Cleanup(func() { _ = client.Close() })
	var err error
	l.lossy, err = redisstore.New(client, &opts)
	require.NoError(t, err)
	l.lossyScript, err = redisstore.New(client, &opts)
	require.NoError(t, err)
	redisstore.ClaimWithScriptOnly(l.lossyScript)
	return l // newCodecRedis loaded every script on the server
}

// lossyClaimers are the two paths of a claim through the proxy.
func (l *lossyRedis) lossyClaimers() map[string]*redisstore.Store {
	return map[string]*redisstore.Store{"plain": l.lossy, "script": l.lossyScript}
}

// dropOnce runs call with the reply of its first script call on key dropped,
// checks that exactly that reply was dropped (so the call's answer is the
// resend's), and returns how many writes the first try and the resend made
// together.
func (l *lossyRedis) dropOnce(t *testing.T, key string, call func() error) (int64, error) {
	t.Helper()
	return l.dropOnceOf(t, "evalsha", key, call)
}

// dropOnceOf is dropOnce of the first command named command on key: the
// plain claim's "set", or a script's "evalsha".
func (l *lossyRedis) dropOnceOf(t *testing.T, command, key string, call func() error) (int64, error) {
	t.Helper()
	dropped, n := l.proxy.Dropped(), writes(t, l.client)
	l.proxy.DropReply(testserver.Command(command, key))
	err := call()
	require.Equal(t, dropped+1, l.proxy.Dropped(), "the first reply was dropped")
	return writes(t, l.client) - n, err
}

// TestLostRepliesOfTheCommonPaths drops the reply of a transition settled by
// its common path after Redis ran it: go-redis resends the same script,
// which now meets what the first try wrote. The
// resend must answer what the first try would have, count no attempt, and
// write no second time where the transition is already done.
func TestLostRepliesOfTheCommonPaths(t *testing.T) {
	modes := map[string]redisstore.Options{
		"auto-pipelined": {},
		"on its own":     {DisableAutoPipelining: true},
		// The test's Redis has no replica, so each WAIT falls short after
		// its timeout, and from then on a call goes on a held connection,
		// WAIT only after a write: a call whose reply is lost there is sent
		// again as one pipeline with WAIT, which go-redis resends.
		"replica acknowledgement": {Replicas: 1, ReplicaTimeout: 10 * time.Millisecond},
	}
	for mode, opts := range modes {
		t.Run(mode, func(t *testing.T) {
			l := startLossyRedis(t, opts)
			ctx := context.Background()

			for path, s := range l.lossyClaimers() {
				command := "evalsha"
				if path == "plain" {
					command = "set"
				}
				t.Run("fresh claim/"+path, func(t *testing.T) {
					key := "lost:fresh:" + path
					req := claimReq(time.Minute, []byte("fp"))
					var res idempotency.ClaimResult
					_, err := l.dropOnceOf(t, command, key, func() (err error) { res, err = s.Claim(ctx, key, req); return err })
					require.NoError(t, err)
					assert.True(t, res.Acquired, "the resend re-acquires its own claim")
					assert.Equal(t, 1, res.Record.Attempts, "and counts no attempt")
					assert.Equal(t, req.Token, res.Record.Token)
					assert.Equal(t, []byte("fp"), res.Record.Fingerprint)
					got, err := l.store.Get(ctx, key)
					require.NoError(t, err)
					assert.Equal(t, res.Record, got)
				})

				t.Run("claim of a completed key/"+path, func(t *testing.T) {
					key := "lost:duplicate:" + path
					require.NoError(t, l.client.Set(ctx, key, completed(2, 1000, 2000, "tok", []byte("fp"), []byte("out")), time.Hour).Err())
					var res idempotency.ClaimResult
					n, err := l.dropOnceOf(t, command, key, func() (err error) { res, err = s.Claim(ctx, key, claimReq(time.Minute, nil)); return err })
					require.NoError(t, err)
					assert.Zero(t, n, "neither try wrote")
					assert.False(t, res.Acquired)
					assert.Equal(t, idempotency.StateCompleted, res.Record.State)
					assert.Equal(t, []byte("out"), res.Record.Result)
				})

				t.Run("claim of a lapsed lease/"+path, func(t *testing.T) {
					key := "lost:lapsed:" + path
					require.NoError(t, l.client.Set(ctx, key, pf('P', 2, 1000, 2000, 3000, 60000, "tok", nil), time.Minute).Err())
					req := claimReq(time.Minute, nil)
					var res idempotency.ClaimResult
					_, err := l.dropOnceOf(t, command, key, func() (err error) { res, err = s.Claim(ctx, key, req); return err })
					require.NoError(t, err)
					assert.True(t, res.Acquired)
					assert.Equal(t, 3, res.Record.Attempts, "one attempt more than the record's, not two")
					assert.Equal(t, time.UnixMilli(1000), res.Record.CreatedAt)
				})
			}

			t.Run("complete", func(t *testing.T) {
				key := "lost:complete"
				req := claimReq(time.Minute, []byte("fp"))
				_, err := l.lossy.Claim(ctx, key, req)
				require.NoError(t, err)
				n, err := l.dropOnce(t, key, func() error { return l.lossy.Complete(ctx, key, req.Token, []byte("out"), time.Hour) })
				require.NoError(t, err, "the resent Complete succeeds")
				assert.Equal(t, int64(1), n, "one write: the resend found the record completed by its token")
				rec, err := l.store.Get(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, idempotency.StateCompleted, rec.State)
				assert.Equal(t, []byte("out"), rec.Result)
			})

			t.Run("renew", func(t *testing.T) {
				key := "lost:renew"
				req := claimReq(time.Minute, nil)
				_, err := l.lossy.Claim(ctx, key, req)
				require.NoError(t, err)
				n, err := l.dropOnce(t, key, func() error { return l.lossy.Renew(ctx, key, req.Token, time.Hour) })
				require.NoError(t, err, "the resent Renew renews again")
				assert.Equal(t, int64(2), n)
				rec, err := l.store.Get(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, idempotency.StateInProgress, rec.State)
				assert.True(t, rec.LeaseExpiresAt.After(time.Now().Add(59*time.Minute)))
			})

			t.Run("renew of a completed key", func(t *testing.T) {
				// The renewal's first try lands, its reply is lost, and the owner's
				// Complete is applied before the resend: the resend meets the
				// owner's COMPLETED string.
				key := "lost:renew-completed"
				req := claimReq(time.Minute, nil)
				_, err := l.lossy.Claim(ctx, key, req)
				require.NoError(t, err)
				require.NoError(t, l.store.Complete(ctx, key, req.Token, nil, time.Hour))
				n, err := l.dropOnce(t, key, func() error { return l.lossy.Renew(ctx, key, req.Token, time.Hour) })
				assert.ErrorIs(t, err, idempotency.ErrCompletedByOwner)
				assert.Zero(t, n)
			})

			// Fail and Release: the codec decides both tries.
			t.Run("fail", func(t *testing.T) {
				key := "lost:fail"
				require.NoError(t, l.client.Set(ctx, key, pf('P', 2, 1000, 2000, farMs(), 60000, "tok", nil), time.Hour).Err())
				n, err := l.dropOnce(t, key, func() error { return l.lossy.Fail(ctx, key, "tok", time.Hour) })
				require.NoError(t, err, "the resent Fail finds the FAILED string of its token")
				assert.Equal(t, int64(1), n)
				next, err := l.store.Claim(ctx, key, claimReq(time.Minute, nil))
				require.NoError(t, err)
				assert.True(t, next.Acquired)
				assert.Equal(t, 3, next.Record.Attempts)
			})

			t.Run("release", func(t *testing.T) {
				key := "lost:release"
				require.NoError(t, l.client.Set(ctx, key, pf('P', 2, 1000, 2000, farMs(), 60000, "tok", nil), time.Hour).Err())
				n, err := l.dropOnce(t, key, func() error { return l.lossy.Release(ctx, key, "tok") })
				require.NoError(t, err)
				assert.Equal(t, int64(1), n, "the resend undid nothing a second time")
				rec, err := l.store.Get(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, idempotency.StateFailed, rec.State)
				assert.Equal(t, 1, rec.Attempts)
			})

		})
	}
}

// TestCompleteResentAfterTheLeaseLapsed: the owner's Complete is applied,
// its lease would have lapsed since, and the Complete comes again (a resend
// that waited out a slow network): it still succeeds, and the owner's
// Renew is ErrCompletedByOwner, not ErrLeaseLost.
func TestCompleteResentAfterTheLeaseLapsed(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	const lease = 30 * time.Millisecond

	req := claimReq(lease, nil)
	_, err := r.store.Claim(ctx, "lapsed-after:string", req)
	require.NoError(t, err)
	require.NoError(t, r.store.Complete(ctx, "lapsed-after:string", req.Token, []byte("out"), time.Hour))

	time.Sleep(2 * lease)
	for key, token := range map[string]string{"lapsed-after:string": req.Token} {
		untouched(t, r.client, key, func() {
			assert.NoError(t, r.store.Complete(ctx, key, token, []byte("out"), time.Hour), key)
			assert.ErrorIs(t, r.store.Renew(ctx, key, token, lease), idempotency.ErrCompletedByOwner, key)
			assert.ErrorIs(t, r.store.Fail(ctx, key, token, time.Hour), idempotency.ErrLeaseLost, key)
			assert.ErrorIs(t, r.store.Complete(ctx, key, "other", nil, time.Hour), idempotency.ErrLeaseLost, key)
		})
	}
}

// TestOneMillisecondLease claims with the shortest lease there is (1 ns,
// rounded up to 1 ms): once it has lapsed, the scripts fence the
// owner without writing (Renew and Complete answer ErrLeaseLost), Fail and Release change nothing, and the next claim on either
// path counts the lapsed attempt.
func TestOneMillisecondLease(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	for path, s := range r.claimers() {
		t.Run(path, func(t *testing.T) {
			key := "1ms:" + path
			req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Nanosecond, TTL: time.Minute}
			res, err := s.Claim(ctx, key, req)
			require.NoError(t, err)
			require.True(t, res.Acquired)
			assert.Equal(t, res.Record.CreatedAt.Add(time.Millisecond), res.Record.LeaseExpiresAt)
			// The deadline the record keeps (lapsed by the time Get reads it,
			// or soon after): the reported one, but for a plain claim's.
			kept, err := r.store.Get(ctx, key)
			require.NoError(t, err)
			kept.State, kept.Token = idempotency.StateInProgress, req.Token
			sameClaim(t, path, res.Record, kept, "the kept record")
			time.Sleep(5 * time.Millisecond)
			untouched(t, r.client, key, func() {
				assert.ErrorIs(t, r.store.Renew(ctx, key, req.Token, time.Nanosecond), idempotency.ErrLeaseLost)
				assert.ErrorIs(t, r.store.Complete(ctx, key, req.Token, nil, time.Nanosecond), idempotency.ErrLeaseLost)
				assert.ErrorIs(t, r.store.Fail(ctx, key, req.Token, time.Nanosecond), idempotency.ErrLeaseLost)
				assert.NoError(t, r.store.Release(ctx, key, req.Token))
				rec, err := r.store.Get(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, idempotency.StateFailed, rec.State)
				assert.Equal(t, kept.LeaseExpiresAt, rec.LeaseExpiresAt)
			})
			next, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
			require.NoError(t, err)
			require.True(t, next.Acquired)
			assert.Equal(t, 2, next.Record.Attempts)
		})
	}
}

// TestTTLClampsThroughTheFastPaths claims, renews and completes with the
// longest durations a caller can pass (time.Duration(math.MaxInt64), and
// idempotency.MaxTTL itself), on both claim paths and through the codec:
// each is clamped to MaxTTL, the 6-byte fields hold the
// deadline and the retention exactly, and the key's expiry is lease + TTL,
// never an overflow into the past or a SET error.
func TestTTLClampsThroughTheFastPaths(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	pttl := func(t *testing.T, key string) time.Duration {
		t.Helper()
		d, err := r.client.PTTL(ctx, key).Result()
		require.NoError(t, err)
		return d
	}
	for _, d := range []time.Duration{time.Duration(math.MaxInt64), idempotency.MaxTTL, idempotency.MaxTTL + 1} {
		for path, s := range r.claimers() {
			t.Run(d.String()+"/"+path, func(t *testing.T) {
				key := "clamp:" + path + ":" + d.String()
				req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: d, TTL: d}
				res, err := s.Claim(ctx, key, req)
				require.NoError(t, err)
				require.True(t, res.Acquired)
				rec := res.Record
				assert.Equal(t, rec.CreatedAt.Add(idempotency.MaxTTL), rec.LeaseExpiresAt)
				raw, err := r.client.Get(ctx, key).Bytes()
				require.NoError(t, err)
				assert.Equal(t, claimedRaw(path, rec, idempotency.MaxTTL, idempotency.MaxTTL, req.Token, nil), raw)
				assert.InDelta(t, float64(2*idempotency.MaxTTL), float64(pttl(t, key)), float64(time.Minute), "lease + TTL")

				require.NoError(t, r.store.Renew(ctx, key, req.Token, d))
				got, err := r.store.Get(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, idempotency.StateInProgress, got.State)
				assert.InDelta(t, float64(time.Now().Add(idempotency.MaxTTL).UnixMilli()), float64(got.LeaseExpiresAt.UnixMilli()), float64(time.Minute.Milliseconds()))
				assert.InDelta(t, float64(2*idempotency.MaxTTL), float64(pttl(t, key)), float64(time.Minute))

				require.NoError(t, r.store.Complete(ctx, key, req.Token, []byte("r"), d))
				assert.InDelta(t, float64(idempotency.MaxTTL), float64(pttl(t, key)), float64(time.Minute))
				got, err = r.store.Get(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, idempotency.StateCompleted, got.State)
			})
		}
	}

	t.Run("codec", func(t *testing.T) {
		key := "clamp:codec"
		require.NoError(t, r.client.Set(ctx, key, pf('P', 2, 1000, 2000, farMs(), 60000, "tok", nil), time.Hour).Err())
		require.NoError(t, r.store.Renew(ctx, key, "tok", time.Duration(math.MaxInt64)))
		assert.InDelta(t, float64(idempotency.MaxTTL+time.Minute), float64(pttl(t, key)), float64(time.Minute), "the new lease + the record's retention")
		require.NoError(t, r.store.Fail(ctx, key, "tok", time.Duration(math.MaxInt64)))
		assert.InDelta(t, float64(idempotency.MaxTTL), float64(pttl(t, key)), float64(time.Minute))
		res, err := r.store.Claim(ctx, key, idempotency.ClaimRequest{Token: "next", Lease: time.Duration(math.MaxInt64), TTL: time.Duration(math.MaxInt64)})
		require.NoError(t, err)
		require.True(t, res.Acquired)
		assert.Equal(t, 3, res.Record.Attempts)
		assert.InDelta(t, float64(2*idempotency.MaxTTL), float64(pttl(t, key)), float64(time.Minute))
	})
}

// TestOddKeyBytes runs every transition, through the plain claim and the
// codec, under keys of bytes that a script would mangle if a key were ever
// spliced into its text or compared as text: NUL, the tag bytes, CR LF,
// Lua pattern characters, quotes, invalid UTF-8, and a long key.
func TestOddKeyBytes(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	keys := []string{"\x00", "\xC0P", "\xC1", "a\r\nb", "%d+$^.*[", "'\"]]--", "\xff\xfe", "{slot}", strings.Repeat("\xC0\x00", 500)}
	for i, key := range keys {
		for path, s := range r.claimers() {
			key := key + ":" + path
			req := claimReq(time.Minute, []byte(key))
			res, err := s.Claim(ctx, key, req)
			require.NoError(t, err, i)
			require.True(t, res.Acquired, i)
			require.NoError(t, r.store.Renew(ctx, key, req.Token, time.Minute), i)
			require.NoError(t, r.store.Fail(ctx, key, req.Token, time.Minute), i)
			req = claimReq(time.Minute, nil)
			res, err = s.Claim(ctx, key, req)
			require.NoError(t, err, i)
			require.True(t, res.Acquired, i)
			assert.Equal(t, 2, res.Record.Attempts, i)
			require.NoError(t, r.store.Complete(ctx, key, req.Token, []byte(key), time.Minute), i)
			dup, err := s.Claim(ctx, key, claimReq(time.Minute, []byte(key)))
			require.NoError(t, err, i)
			assert.False(t, dup.Acquired, i)
			assert.Equal(t, []byte(key), dup.Record.Result, i)
			assert.Equal(t, []byte(key), dup.Record.Fingerprint, i)
			n, err := r.client.Exists(ctx, key).Result()
			require.NoError(t, err)
			assert.Equal(t, int64(1), n, "the record is under the key as given (%d)", i)
		}
	}
}

// TestClaimOfARecordAtTheMostAttempts claims records whose attempts field is
// at its widest (2^32 - 1, the 4 bytes of the string layout): the claim must not write an
// attempts field that wraps to 0, which the store itself would then read as
// corrupt (the new owner's Renew and Complete failing with
// ErrCorruptRecord), nor report a count it did not store. The count stays
// at its widest.
func TestClaimOfARecordAtTheMostAttempts(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	const most = math.MaxUint32
	records := map[string]func(key string) error{
		"failed string": func(key string) error {
			return r.client.Set(ctx, key, pf('F', most, 1000, 2000, 0, 0, "tok", nil), time.Hour).Err()
		},
		"lapsed string": func(key string) error {
			return r.client.Set(ctx, key, pf('P', most, 1000, 2000, 3000, 60000, "tok", nil), time.Hour).Err()
		},
	}
	for name, put := range records {
		for path, s := range r.claimers() {
			t.Run(name+"/"+path, func(t *testing.T) {
				key := "most:" + path + ":" + name
				require.NoError(t, put(key))
				req := claimReq(time.Minute, nil)
				res, err := s.Claim(ctx, key, req)
				require.NoError(t, err)
				require.True(t, res.Acquired)
				got, err := r.store.Get(ctx, key)
				require.NoError(t, err, "the claim wrote a record the store reads")
				assert.Equal(t, res.Record, got, "the claim reported what it stored")
				assert.Equal(t, most, got.Attempts)
				require.NoError(t, r.store.Renew(ctx, key, req.Token, time.Minute))
				require.NoError(t, r.store.Complete(ctx, key, req.Token, nil, time.Minute))
			})
		}
	}
}

// TestReplicaGetsTheCommonPathsWrites acknowledges every claim, renewal and
// completion by a replica (Options.Replicas) while they take the common
// paths (the plain SET NX GET, claim.lua on an absent key, GET TIME SET)
// and the codec (the claim of a FAILED record): each is acknowledged, and
// the replica holds the primary's very bytes and expiry after each, so a
// failover to it keeps what the owner was told.
func TestReplicaGetsTheCommonPathsWrites(t *testing.T) {
	t.Parallel()
	master, replica := startReplicated(t)
	r := newCodecRedis(t, master.Addr)
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rc.Close() })
	ctx := context.Background()
	ack := func(scriptOnly bool) *redisstore.Store {
		s, err := redisstore.New(r.client, &redisstore.Options{Replicas: 1, ReplicaTimeout: 2 * time.Second})
		require.NoError(t, err)
		if scriptOnly {
			redisstore.ClaimWithScriptOnly(s)
		}
		return s
	}
	same := func(t *testing.T, key, step string) {
		t.Helper()
		assert.Equal(t, dump(t, r.client, key), dump(t, rc, key), "%s: the replica holds the primary's value", step)
		mt, err := r.client.PExpireTime(ctx, key).Result()
		require.NoError(t, err)
		rt, err := rc.PExpireTime(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, mt, rt, "%s: and its expiry", step)
	}
	for path, s := range map[string]*redisstore.Store{"plain": ack(false), "script": ack(true)} {
		t.Run(path, func(t *testing.T) {
			before := s.ReplicaStats()
			key := "replica:" + path
			req := claimReq(time.Minute, []byte("fp"))
			res, err := s.Claim(ctx, key, req)
			require.NoError(t, err)
			require.True(t, res.Acquired)
			same(t, key, "claim")
			require.NoError(t, s.Renew(ctx, key, req.Token, time.Hour))
			same(t, key, "renew")
			require.NoError(t, s.Complete(ctx, key, req.Token, []byte("out"), time.Hour))
			same(t, key, "complete")
			dup, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
			require.NoError(t, err)
			assert.False(t, dup.Acquired)
			assert.Equal(t, []byte("out"), dup.Record.Result)

			failed := "replica-failed:" + path
			require.NoError(t, r.client.Set(ctx, failed, pf('F', 2, 1000, 2000, 0, 0, "tok", []byte("fp")), 10*time.Minute).Err())
			require.Eventually(t, func() bool { return dump(t, rc, failed) != "" }, 5*time.Second, 10*time.Millisecond)
			req = claimReq(time.Minute, nil)
			res, err = s.Claim(ctx, failed, req)
			require.NoError(t, err)
			require.True(t, res.Acquired)
			assert.Equal(t, 3, res.Record.Attempts)
			same(t, failed, "claim of a FAILED record")
			require.NoError(t, s.Complete(ctx, failed, req.Token, nil, time.Hour))
			same(t, failed, "complete after it")

			assert.Equal(t, redisstore.ReplicaStats{Acknowledged: before.Acknowledged + 5}, s.ReplicaStats(),
				"every transition that wrote acknowledged (the duplicate wrote nothing)")
		})
	}
}

// TestClusterCommonPathsAndTheCodec spreads keys over the three primaries of
// a Cluster and runs them through the common paths (both claim paths),
// the codec (a live lease of another owner, written by hand; a HASH) and
// the Go decoding of a claim's COMPLETED string, corrupt values included:
// the same answers as on one Redis, each script touching only its key's
// node.
func TestClusterCommonPathsAndTheCodec(t *testing.T) {
	t.Parallel()
	addrs := testserver.StartRedisCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	script, err := redisstore.New(client, nil)
	require.NoError(t, err)
	redisstore.ClaimWithScriptOnly(script)
	ctx := context.Background()
	for path, c := range map[string]*redisstore.Store{"plain": s, "script": script} {
		for i := range 9 {
			key := "cluster:" + path + ":" + strconv.Itoa(i)
			req := claimReq(time.Minute, []byte("fp"))
			res, err := c.Claim(ctx, key, req)
			require.NoError(t, err)
			require.True(t, res.Acquired)
			require.NoError(t, s.Renew(ctx, key, req.Token, time.Minute))
			require.NoError(t, s.Complete(ctx, key, req.Token, []byte("out"), time.Hour))
			require.NoError(t, s.Complete(ctx, key, req.Token, []byte("out"), time.Hour), "resent")
			dup, err := c.Claim(ctx, key, claimReq(time.Minute, nil))
			require.NoError(t, err)
			assert.False(t, dup.Acquired)
			assert.Equal(t, []byte("out"), dup.Record.Result)

			live := "cluster-live:" + path + ":" + strconv.Itoa(i)
			require.NoError(t, client.Set(ctx, live, pf('P', 2, 1000, 2000, farMs(), 60000, "tok", []byte("fp")), time.Hour).Err())
			held, err := c.Claim(ctx, live, claimReq(time.Minute, nil))
			require.NoError(t, err)
			assert.False(t, held.Acquired, "a live lease is held")
			require.NoError(t, s.Renew(ctx, live, "tok", time.Minute))
			require.NoError(t, s.Complete(ctx, live, "tok", nil, time.Hour))
			got, err := s.Get(ctx, live)
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateCompleted, got.State)
			assert.Equal(t, 2, got.Attempts)

			hash := "cluster-hash:" + path + ":" + strconv.Itoa(i)
			require.NoError(t, client.HSet(ctx, hash, "s", "P", "o", "tok", "a", "2", "c", "1000", "u", "2000", "l", strconv.FormatUint(farMs(), 10), "r", "60000").Err())
			_, err = c.Claim(ctx, hash, claimReq(time.Minute, nil))
			assert.ErrorIs(t, err, idempotency.ErrCorruptRecord, "a HASH is another type")
			assert.ErrorContains(t, err, "wrong type hash")
			assert.ErrorIs(t, s.Complete(ctx, hash, "tok", nil, time.Hour), idempotency.ErrCorruptRecord)
			typ, err := client.Type(ctx, hash).Result()
			require.NoError(t, err)
			assert.Equal(t, "hash", typ, "never overwritten")

			bad := "cluster-corrupt:" + path + ":" + strconv.Itoa(i)
			require.NoError(t, client.Set(ctx, bad, cat(cHeader(1, 1000, 2000), []byte{255, 0, 0, 0, 7}), 0).Err())
			_, err = c.Claim(ctx, bad, claimReq(time.Minute, nil))
			assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)
			assert.ErrorContains(t, err, "string: bad fingerprint length")
			ttl, err := client.PTTL(ctx, bad).Result()
			require.NoError(t, err)
			assert.Equal(t, time.Duration(-1), ttl, "no expiry given")
		}
	}
}

// TestOddTokens holds keys with tokens that the scripts compare byte
// by byte against the owner field: NUL and tag bytes, tokens that differ
// from the owner only in their last byte or in their length (a prefix, an
// extension), and a token of 1 MiB. Only the exact token renews, completes
// or fails; every near miss is ErrLeaseLost and writes nothing.
func TestOddTokens(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	tokens := []string{"\x00", "t\x00k", "\xC0P", "\xC1\xC1\xC1", strings.Repeat("\xff", 37), strings.Repeat("k", 1<<20)}
	for i, token := range tokens {
		for path, s := range r.claimers() {
			key := "token:" + path + ":" + strconv.Itoa(i)
			res, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute})
			require.NoError(t, err)
			require.True(t, res.Acquired)
			assert.Equal(t, token, res.Record.Token)
			last := []byte(token)
			last[len(last)-1]++
			near := []string{string(last), token + "\x00", token[:len(token)-1], "\x00" + token}
			untouched(t, r.client, key, func() {
				for _, other := range near {
					if other == "" {
						continue
					}
					assert.ErrorIs(t, r.store.Renew(ctx, key, other, time.Minute), idempotency.ErrLeaseLost, "%d %q", i, other)
					assert.ErrorIs(t, r.store.Complete(ctx, key, other, nil, time.Minute), idempotency.ErrLeaseLost, "%d", i)
					assert.ErrorIs(t, r.store.Fail(ctx, key, other, time.Minute), idempotency.ErrLeaseLost, "%d", i)
					assert.NoError(t, r.store.Release(ctx, key, other), "%d", i)
					again, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: other, Lease: time.Minute, TTL: time.Minute})
					require.NoError(t, err)
					assert.False(t, again.Acquired, "%d", i)
				}
			})
			got, err := r.store.Get(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, token, got.Token)
			require.NoError(t, r.store.Renew(ctx, key, token, time.Minute))
			require.NoError(t, r.store.Complete(ctx, key, token, nil, time.Minute))
			untouched(t, r.client, key, func() {
				for _, other := range near {
					if other != "" {
						assert.ErrorIs(t, r.store.Complete(ctx, key, other, nil, time.Minute), idempotency.ErrLeaseLost, "%d", i)
					}
				}
				assert.NoError(t, r.store.Complete(ctx, key, token, nil, time.Minute), "%d resent", i)
			})
		}
	}
}

// TestWidestFieldsThroughTheCodec holds an IN_PROGRESS string whose
// lease deadline and retention are the widest the 6-byte fields hold (a
// deadline in the year 10889): the renewal adds the retention to the
// new lease in Lua and sends it as PX (a double written out by Redis: it
// must stay an integer, not 2.8e+14), and the completion keeps the created
// and updated times.
func TestWidestFieldsThroughTheCodec(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	const widest = 1<<48 - 1
	key := "widest"
	require.NoError(t, r.client.Set(ctx, key, pf('P', 1, widest, widest, widest, widest, "tok", nil), time.Hour).Err())
	rec, err := r.store.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, time.UnixMilli(widest), rec.LeaseExpiresAt)
	require.NoError(t, r.store.Renew(ctx, key, "tok", idempotency.MaxTTL))
	pttl, err := r.client.Do(ctx, "pttl", key).Int64() // in ms: more than a time.Duration holds
	require.NoError(t, err)
	assert.InDelta(t, float64(idempotency.MaxTTL.Milliseconds()+widest), float64(pttl), float64(time.Minute.Milliseconds()), "the new lease + the retention")
	require.NoError(t, r.store.Complete(ctx, key, "tok", []byte("r"), time.Hour))
	done, err := r.store.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, done.State)
	assert.Equal(t, time.UnixMilli(widest), done.CreatedAt)
	assert.Equal(t, time.UnixMilli(widest), done.UpdatedAt, "updated never before created, the clock being earlier")
}

// TestCompletedMemoryOnEveryPath completes 48-byte keys without output or
// fingerprint along every path that writes a COMPLETED string (the plain
// claim, claim.lua after a resent claim, a FAILED record, a renewal and
// a record written by hand): each costs the same memory, under the
// 150 bytes the package promises.
func TestCompletedMemoryOnEveryPath(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	key := func(name string) string { return name + strings.Repeat("k", 48-len(name)) }
	paths := map[string]func(key string) string{
		"plain": func(k string) string {
			req := claimReq(time.Minute, nil)
			_, err := r.store.Claim(ctx, k, req)
			require.NoError(t, err)
			return req.Token
		},
		"claim.lua": func(k string) string {
			req := claimReq(time.Minute, nil)
			_, err := r.script.Claim(ctx, k, req)
			require.NoError(t, err)
			return req.Token
		},
		"resent claim": func(k string) string {
			req := claimReq(time.Minute, nil)
			for range 2 {
				_, err := r.store.Claim(ctx, k, req)
				require.NoError(t, err)
			}
			return req.Token
		},
		"after a fail": func(k string) string {
			req := claimReq(time.Minute, nil)
			_, err := r.store.Claim(ctx, k, req)
			require.NoError(t, err)
			require.NoError(t, r.store.Fail(ctx, k, req.Token, time.Hour))
			req = claimReq(time.Minute, nil)
			_, err = r.store.Claim(ctx, k, req)
			require.NoError(t, err)
			return req.Token
		},
		"by hand": func(k string) string {
			require.NoError(t, r.client.Set(ctx, k, pf('P', 1, 1000, 2000, farMs(), 60000, "tok", nil), time.Hour).Err())
			return "tok"
		},
		"renewed": func(k string) string {
			req := claimReq(time.Minute, nil)
			_, err := r.store.Claim(ctx, k, req)
			require.NoError(t, err)
			require.NoError(t, r.store.Renew(ctx, k, req.Token, time.Minute))
			return req.Token
		},
	}
	usage := map[string]int64{}
	for name, claim := range paths {
		k := key("mem:" + name + ":")
		token := claim(k)
		require.NoError(t, r.store.Complete(ctx, k, token, nil, time.Hour))
		raw, err := r.client.Get(ctx, k).Bytes()
		require.NoError(t, err)
		require.Len(t, raw, 26, name)
		usage[name], err = r.client.MemoryUsage(ctx, k).Result()
		require.NoError(t, err)
		assert.Less(t, usage[name], int64(150), "%s: MEMORY USAGE of a COMPLETED 48-byte key", name)
	}
	t.Logf("MEMORY USAGE by path: %v", usage)
	for name, n := range usage {
		assert.Equal(t, usage["plain"], n, "%s costs what the plain claim's path costs", name)
	}
}

// farMs is a lease deadline an hour from now, in ms.
func farMs() uint64 { return uint64(time.Now().Add(time.Hour).UnixMilli()) }
