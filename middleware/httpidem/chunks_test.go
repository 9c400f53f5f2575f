package httpidem_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// TestOutputBoundStreamed: MaxOutputSize bounds a body written in flushed
// chunks as it bounds one write. A body of exactly the bound is replayed
// byte for byte; one byte more reaches the first client whole, and its
// repeats get 410 with the first status.
func TestOutputBoundStreamed(t *testing.T) {
	const max, chunk = 1000, 10
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, MaxOutputSize: max})
		require.NoError(t, err)
		m, err := httpidem.New(once, &httpidem.Config{KeyPrefix: prefix, SingleTenant: true})
		require.NoError(t, err)
		var runs atomic.Int64
		srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			w.WriteHeader(http.StatusAccepted)
			size := max
			if r.URL.Path == "/over" {
				size++
			}
			body := []byte(strings.Repeat(fmt.Sprint(n%10), size))
			for len(body) > 0 {
				c := min(chunk, len(body))
				_, _ = w.Write(body[:c])
				body = body[c:]
				w.(http.Flusher).Flush()
			}
		})))
		t.Cleanup(srv.Close)
		post := func(path string) (*http.Response, string) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, nil)
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", "k-"+path)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp, string(b)
		}

		first, body := post("/fits")
		require.Equal(t, http.StatusAccepted, first.StatusCode)
		require.Len(t, body, max)
		again, replay := post("/fits")
		assert.Equal(t, http.StatusAccepted, again.StatusCode)
		assert.Equal(t, "true", again.Header.Get(httpidem.ReplayedHeader))
		assert.Equal(t, body, replay, "exactly MaxOutputSize is stored")

		first, body = post("/over")
		require.Equal(t, http.StatusAccepted, first.StatusCode)
		assert.Len(t, body, max+1, "the first client gets the whole body")
		again, problem := post("/over")
		require.Equal(t, http.StatusGone, again.StatusCode, problem)
		var p struct {
			Type           string `json:"type"`
			OriginalStatus int    `json:"original_status"`
		}
		require.NoError(t, json.Unmarshal([]byte(problem), &p))
		assert.True(t, strings.HasSuffix(p.Type, "#output_not_stored"), p.Type)
		assert.Equal(t, http.StatusAccepted, p.OriginalStatus)
		assert.EqualValues(t, 2, runs.Load())
	})
}
