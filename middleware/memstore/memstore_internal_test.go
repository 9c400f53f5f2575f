package memstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// Under a stream of unique keys that nothing reads, claims sweep out the
// expired records: the map holds at most twice the live ones plus
// minSweep.
func TestClaimsSweepExpiredRecords(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(func() time.Time { return now })
	ctx := context.Background()
	const live = 100 // each key lives for 100 steps
	for i := range 10_000 {
		k := "k" + strconv.Itoa(i)
		req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Second, TTL: time.Minute}
		_, err := s.Claim(ctx, k, req)
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, k, req.Token, []byte("r"), live*time.Millisecond))
		now = now.Add(time.Millisecond)
		require.LessOrEqual(t, len(s.m), 2*live+minSweep, "step %d", i)
	}
}
