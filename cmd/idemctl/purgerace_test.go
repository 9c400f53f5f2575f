package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// hookReader runs hook at its first Read, then reads r: the operator
// answers the confirmation after the store changed.
type hookReader struct {
	hook func()
	r    io.Reader
}

func (h *hookReader) Read(p []byte) (int, error) {
	if h.hook != nil {
		h.hook()
		h.hook = nil
	}
	return h.r.Read(p)
}

// purge --apply with --state skips a key whose state changed between the
// listing and the delete (while the confirmation waited): a FAILED key
// claimed again, and a corrupt key deleted and claimed again, keep their
// live lease.
func TestPurgeSkipsAKeyThatMovedOn(t *testing.T) {
	eachStore(t, func(t *testing.T, e env) {
		ctx := context.Background()
		for _, state := range []string{"failed", "corrupt"} {
			key := e.key("moved-" + state)
			if state == "failed" {
				e.failTimes(t, key, 1)
			} else {
				e.corrupt(t, key)
			}
			var out, errOut bytes.Buffer
			stdin := &hookReader{r: bytes.NewReader([]byte("y\n")), hook: func() {
				require.NoError(t, e.store.Delete(ctx, key))
				e.claimStuck(t, key)
			}}
			code := run(ctx, append([]string{"purge", "--prefix", key, "--state", state, "--apply", "--json"}, e.flags...), stdin, &out, &errOut)
			require.Equal(t, exitOK, code, "stdout %s; stderr %s", out.String(), errOut.String())
			var v map[string]any
			require.NoError(t, json.Unmarshal(out.Bytes(), &v), out.String())
			assert.EqualValues(t, 1, v["matched"], state)
			assert.EqualValues(t, 0, v["deleted"], state)
			assert.Equal(t, []any{key}, v["skipped"], state)
			rec, err := e.store.Get(ctx, key)
			require.NoError(t, err, state)
			assert.Equal(t, idempotency.StateInProgress, rec.State, "%s: the live lease is kept", state)
			assert.WithinDuration(t, time.Now().Add(time.Minute), rec.LeaseExpiresAt, 30*time.Second, state)
		}
	})
}
