package grpcidem_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
)

// TestConcurrentCalls: 50 concurrent calls with one key give one run. The
// run's caller gets its response; every other answer is its replay or
// ABORTED. The handler is held until ten calls were refused, so that both
// kinds of answer occur.
func TestConcurrentCalls(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		const calls = 50
		l, c := setup(t, kind, nil)
		req := &testpb.ChargeRequest{Amount: 42, Block: true}

		answers := make(chan answer, calls)
		var wg sync.WaitGroup
		for range calls {
			wg.Go(func() { answers <- charge(t, c, "t", "one-key", req) })
		}
		var got []answer
		aborted := 0
		<-l.started
		for aborted < 10 {
			a := <-answers
			got = append(got, a)
			if a.err != nil {
				aborted++
			}
		}
		close(l.release)
		wg.Wait()
		close(answers)
		for a := range answers {
			got = append(got, a)
		}
		require.Len(t, got, calls)
		assert.EqualValues(t, 1, l.runs.Load(), "one run for one key")

		var original *testpb.ChargeReply
		replays, refused := 0, 0
		for _, a := range got {
			if a.err == nil && !a.replayed() {
				require.Nil(t, original, "only one caller gets the run's own response")
				original = a.reply
			}
		}
		require.NotNil(t, original)
		for _, a := range got {
			switch {
			case a.err != nil:
				requireReason(t, a.err, codes.Aborted, inProgress)
				refused++
			case a.replayed():
				assert.True(t, proto.Equal(original, a.reply), "a replay is the run's response")
				replays++
			}
		}
		assert.Equal(t, calls-1, replays+refused)
		t.Logf("%s: 1 run, %d replays, %d ABORTED", kind.Name, replays, refused)
	})
}
