package grpcidem_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
)

// TestKeyLimits: a call without a key, or with a key full of odd bytes,
// sent twice or contradicted is INVALID_ARGUMENT, the handler does not run
// and nothing is claimed; a long key works, stored hashed.
func TestKeyLimits(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		l, c := setup(t, kind, nil)

		missing := charge(t, c, "t", "", &testpb.ChargeRequest{Amount: 1})
		st := requireReason(t, missing.err, codes.InvalidArgument, keyMissing)
		assert.Contains(t, st.Message(), "idempotency-key")

		invalid := map[string]struct {
			md    []string // metadata pairs
			field string
		}{
			"field NUL":             {field: "k\x00"},
			"field tab":             {field: "k\t1"},
			"field non-ASCII":       {field: "clé"},
			"field DEL":             {field: "k\x7f"},
			"metadata empty":        {md: []string{"idempotency-key", ""}},
			"metadata twice":        {md: []string{"idempotency-key", "a", "idempotency-key", "b"}},
			"metadata twice, equal": {md: []string{"idempotency-key", "a", "idempotency-key", "a"}},
			"metadata versus field": {md: []string{"idempotency-key", "a"}, field: "b"},
			"long field, md set":    {md: []string{"idempotency-key", "a"}, field: strings.Repeat("a", 256)},
		}
		for name, tc := range invalid {
			ctx := metadata.AppendToOutgoingContext(t.Context(), append([]string{"tenant", "t"}, tc.md...)...)
			_, err := c.Charge(ctx, &testpb.ChargeRequest{RequestId: tc.field, Amount: 1})
			require.Error(t, err, name)
			st := requireReason(t, err, codes.InvalidArgument, keyInvalid)
			assert.Contains(t, st.Message(), "The idempotency key in ", name)
		}
		assert.Zero(t, l.runs.Load(), "nothing runs without a valid key")

		long := strings.Repeat("k", 1000)
		for range 2 {
			a := charge(t, c, "t", long, &testpb.ChargeRequest{Amount: 1})
			require.NoError(t, a.err)
		}
		// Stored hashed: a key that differs in its last byte is another key.
		for range 2 {
			a := charge(t, c, "t", long[:999]+"j", &testpb.ChargeRequest{Amount: 1})
			require.NoError(t, a.err)
		}
		field := &testpb.ChargeRequest{RequestId: strings.Repeat("f", 1000), Amount: 1}
		for range 2 {
			require.NoError(t, charge(t, c, "t", "", field).err, "a long request field")
		}
		a := charge(t, c, "t", " ~!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}", &testpb.ChargeRequest{Amount: 1})
		require.NoError(t, a.err, "every printable ASCII byte is allowed")
		assert.EqualValues(t, 4, l.runs.Load())
	})
}

// TestKeyOptional: with KeyOptional, a call without a key runs every time;
// one with a key is still idempotent, and an invalid key still refused.
func TestKeyOptional(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		l, c := setup(t, kind, func(cfg *config) { cfg.KeyOptional = true })
		for range 2 {
			require.NoError(t, charge(t, c, "t", "", &testpb.ChargeRequest{Amount: 1}).err)
		}
		assert.EqualValues(t, 2, l.runs.Load())
		for range 2 {
			require.NoError(t, charge(t, c, "t", "k1", &testpb.ChargeRequest{Amount: 1}).err)
		}
		assert.EqualValues(t, 3, l.runs.Load())
		bad := charge(t, c, "t", "", &testpb.ChargeRequest{RequestId: "k\x00", Amount: 1})
		requireReason(t, bad.err, codes.InvalidArgument, keyInvalid)
	})
}

// TestOversizeAnswer: an answer over MaxResponseSize reaches the first
// caller in full, the key is completed without it, and repeats are
// ALREADY_EXISTS with the original code and size; the handler never runs
// again. An answer just within the bound is replayed.
func TestOversizeAnswer(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		const max = 512
		l, c := setup(t, kind, func(cfg *config) { cfg.MaxOutputSize = max })

		big := &testpb.ChargeRequest{Amount: 1, ReplySize: 600}
		first := charge(t, c, "t", "big", big)
		require.NoError(t, first.err)
		assert.Len(t, first.reply.Padding, 600, "the first caller gets the whole response")
		for range 2 {
			again := charge(t, c, "t", "big", big)
			st := requireReason(t, again.err, codes.AlreadyExists, responseNotStored)
			info := errorInfoOf(t, again.err)
			assert.Equal(t, "OK", info.Metadata["original_code"])
			assert.NotEmpty(t, info.Metadata["size"])
			assert.Contains(t, st.Message(), "too large to store")
			assert.False(t, again.replayed(), "nothing is replayed")
		}
		assert.EqualValues(t, 1, l.runs.Load(), "the effect happened once: it is never run again")

		// A status whose details exceed the bound is not stored either.
		bigStatus := &testpb.ChargeRequest{Amount: 2, Code: int32(codes.NotFound), WithDetails: true}
		l2, c2 := setup(t, kind, func(cfg *config) { cfg.MaxOutputSize = 40 })
		require.Equal(t, codes.NotFound, status.Code(charge(t, c2, "t", "bigstatus", bigStatus).err))
		again := charge(t, c2, "t", "bigstatus", bigStatus)
		requireReason(t, again.err, codes.AlreadyExists, responseNotStored)
		assert.Equal(t, "NotFound", errorInfoOf(t, again.err).Metadata["original_code"])
		assert.EqualValues(t, 1, l2.runs.Load())

		// Within the bound: replayed.
		fits := &testpb.ChargeRequest{Amount: 3, ReplySize: 400}
		first = charge(t, c, "t", "fits", fits)
		require.NoError(t, first.err)
		again = charge(t, c, "t", "fits", fits)
		require.NoError(t, again.err)
		assert.True(t, again.replayed())
		assert.Len(t, again.reply.Padding, 400)
	})
}

func errorInfoOf(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	info := errorInfo(status.Convert(err))
	require.NotNil(t, info)
	return info
}

// TestMaxAttemptsOfTheOnce: the Once's MaxAttempts caps the runs of one
// key; the call after the last is FAILED_PRECONDITION, and nothing runs.
func TestMaxAttemptsOfTheOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		l, c := setup(t, kind, func(cfg *config) { cfg.MaxAttempts = 2 })
		failing := &testpb.ChargeRequest{Amount: 1, Code: int32(codes.Unavailable)}
		for range 2 {
			assert.Equal(t, codes.Unavailable, status.Code(charge(t, c, "t", "k1", failing).err))
		}
		for range 2 {
			requireReason(t, charge(t, c, "t", "k1", failing).err, codes.FailedPrecondition, tooManyAttempts)
		}
		assert.EqualValues(t, 2, l.runs.Load())
		assert.Equal(t, codes.Unavailable, status.Code(charge(t, c, "t", "k2", failing).err), "another key runs")
		assert.EqualValues(t, 3, l.runs.Load())
	})
}
