package httpidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
)

// TestConcurrentRequestsOneKey sends 50 requests with one key at once over
// real HTTP: the handler runs once, and every answer is the original
// response (the one that ran, or its byte-identical replay) or a 409.
// With a fast handler most repeats are replays; with a handler that is held
// until the 49 others have answered, all of them are 409.
func TestConcurrentRequestsOneKey(t *testing.T) {
	const n = 50
	for _, path := range []string{"/pay", "/block"} {
		t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
			eachStore(t, func(t *testing.T, kind storeKind) {
				store, prefix := kind.New(t)
				api := newPayments()
				srv := httptest.NewServer(newMiddleware(t, store, prefix, nil).Handler(api))
				t.Cleanup(srv.Close)

				answers := make(chan answer, n)
				var start sync.WaitGroup
				start.Add(1)
				for range n {
					go func() {
						start.Wait()
						answers <- post(t, srv, path, "one-key", `{"amount":100}`)
					}()
				}
				start.Done()
				var got []answer
				if path == "/block" {
					<-api.started
					for range n - 1 {
						got = append(got, <-answers)
					}
					close(api.release)
				}
				for len(got) < n {
					got = append(got, <-answers)
				}
				checkOneRun(t, api, got, path == "/block")
			})
		})
	}
}

type answer struct {
	status int
	header http.Header
	body   string
}

// post sends one POST over HTTP; the Date header is dropped from the answer.
func post(t *testing.T, srv *httptest.Server, path, key, body string) answer {
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	if !assert.NoError(t, err) {
		return answer{}
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := srv.Client().Do(req)
	if !assert.NoError(t, err) {
		return answer{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	assert.NoError(t, err)
	resp.Header.Del("Date")
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// withoutLength returns a's headers without Content-Length, after checking
// that a Content-Length it has is the length of its body.
func withoutLength(t *testing.T, a *answer) http.Header {
	h := a.header.Clone()
	if n := h.Get("Content-Length"); n != "" {
		assert.Equal(t, strconv.Itoa(len(a.body)), n, "Content-Length")
	}
	h.Del("Content-Length")
	return h
}

func checkOneRun(t *testing.T, api *payments, answers []answer, allConflicts bool) {
	t.Helper()
	require.EqualValues(t, 1, api.runs.Load(), "handler runs")
	var original *answer
	for i := range answers {
		if answers[i].status == http.StatusCreated && answers[i].header.Get(httpidem.ReplayedHeader) == "" {
			require.Nil(t, original, "two answers claim to be the original")
			original = &answers[i]
		}
	}
	require.NotNil(t, original, "the request that ran must get its own answer")
	var replayed, conflicts int
	for i := range answers {
		a := &answers[i]
		switch {
		case a == original:
		case a.status == http.StatusConflict:
			conflicts++
			assert.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
			assert.Equal(t, "1", a.header.Get("Retry-After"))
		case a.header.Get(httpidem.ReplayedHeader) == "true":
			replayed++
			// Content-Length is framing, set by net/http for each answer
			// (doc.go): the original is sent chunked when recording it
			// took longer than flushAfter. Where present it must be right.
			want, got := withoutLength(t, original), withoutLength(t, a)
			want.Set(httpidem.ReplayedHeader, "true")
			assert.Equal(t, original.status, a.status)
			assert.Equal(t, want, got)
			assert.Equal(t, original.body, a.body)
		default:
			t.Errorf("unexpected answer %d %v %s", a.status, a.header, a.body)
		}
	}
	t.Logf("1 original, %d replayed, %d conflicts", replayed, conflicts)
	assert.Equal(t, len(answers)-1, replayed+conflicts)
	if allConflicts {
		assert.Equal(t, len(answers)-1, conflicts)
	}
}
