package httpidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestTransportZeroValue: a Transport with no field set is ready: it gives
// a POST one key, retries a 5xx with it, and the server runs the effect
// once more only because the first run failed.
func TestTransportZeroValue(t *testing.T) {
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil)})
	require.NoError(t, err)
	m, err := httpidem.New(once, &httpidem.Config{SingleTenant: true})
	require.NoError(t, err)
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "paid")
	})))
	t.Cleanup(srv.Close)

	client := &http.Client{Transport: &httpidem.Transport{}}
	for range 2 {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader("{}"))
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, "paid", string(b))
	}
	require.Len(t, keys, 3, "a 503 retried, then a new call with a key of its own")
	assert.NotEmpty(t, keys[0])
	assert.Equal(t, keys[0], keys[1], "the retry sends the same key")
	assert.NotEqual(t, keys[1], keys[2], "each call has its own key")
}
