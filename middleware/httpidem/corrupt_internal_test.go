package httpidem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// TestCorruptRedisRecord puts foreign values under the very key the
// middleware stores a request's record at, on a real Redis: each is
// answered 500 (ProblemRecordCorrupt), never replayed as a response and
// never overwritten, and the handler does not run.
func TestCorruptRedisRecord(t *testing.T) {
	client := testserver.RedisClient(t)
	store, err := redisstore.New(client, nil)
	require.NoError(t, err)
	var b [8]byte
	_, _ = rand.Read(b[:])
	prefix := "httpidemtest-" + hex.EncodeToString(b[:])
	ctx := context.Background()
	t.Cleanup(func() {
		keys, _ := client.Keys(ctx, prefix+":*").Result()
		if len(keys) > 0 {
			_ = client.Del(ctx, keys...).Err()
		}
	})

	var runs atomic.Int64
	logger := watermill.NewCaptureLogger()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Logger: logger})
	require.NoError(t, err)
	m, err := New(once, &Config{KeyPrefix: prefix, Scope: func(r *http.Request) string { return r.Header.Get("X-Tenant") }})
	require.NoError(t, err)
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))

	foreign := map[string]func(key string) error{
		"short string": func(k string) error { return client.Set(ctx, k, "x", 0).Err() },
		"long string":  func(k string) error { return client.Set(ctx, k, strings.Repeat("not a record ", 10), 0).Err() },
		"JSON":         func(k string) error { return client.Set(ctx, k, `{"state":"completed","status":201}`, 0).Err() },
		"a list":       func(k string) error { return client.RPush(ctx, k, "a", "b").Err() },
		"a bad hash":   func(k string) error { return client.HSet(ctx, k, "state", "nope", "attempts", "many").Err() },
	}
	for name, put := range foreign {
		t.Run(name, func(t *testing.T) {
			k := "k-" + strings.ReplaceAll(name, " ", "-")
			skey := storeKey(prefix, "t", k)
			require.NoError(t, put(skey))
			dump := client.Dump(ctx, skey).Val()

			req := httptest.NewRequest(http.MethodPost, "/pay", nil)
			req.Header.Set(defaultHeader, k)
			req.Header.Set("X-Tenant", "t")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)

			assert.Equal(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
			assert.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
			var p problem
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
			assert.Equal(t, problemTypeBase+string(idempotency.OutcomeCorruptRecord), p.Type)
			assert.Contains(t, p.Detail, "idempotency record of this key cannot be read")
			assert.Empty(t, rec.Header().Get(ReplayedHeader))
			assert.Equal(t, dump, client.Dump(ctx, skey).Val(), "the foreign value is left as it was")
		})
	}
	assert.Zero(t, runs.Load(), "nothing runs over a record that cannot be read")
	errs := logger.Captured()[watermill.ErrorLogLevel]
	require.Len(t, errs, len(foreign))
	for _, e := range errs {
		assert.ErrorIs(t, e.Err, idempotency.ErrCorruptRecord)
		assert.True(t, strings.HasPrefix(e.Fields["idempotency_key"].(string), prefix), "logged with its key")
	}
}
