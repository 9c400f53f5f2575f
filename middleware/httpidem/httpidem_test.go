package httpidem_test

import (
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
)

// step is one request of a scenario and what it must get.
type step struct {
	name    string
	method  string   // "" means POST
	path    string   // "" means /pay
	keys    []string // Idempotency-Key header values; nil sends none
	tenant  string
	body    string
	blocked bool // the handler blocks; the step runs in the background until the scenario ends

	wantStatus  int
	wantProblem *problemKind // the answer is this problem, not the handler's
	wantReplays string       // the answer replays the response of the named earlier step
	wantPanic   bool
	wantRunsNow int64 // handler runs counted after this step (checked when > 0)
}

func key(k string) []string { return []string{k} }

func TestStatuses(t *testing.T) {
	long := strings.Repeat("k", 255)
	cases := []struct {
		name     string
		adjust   func(*config)
		steps    []step
		wantRuns int64
	}{
		{name: "first request runs, repeat is replayed", steps: []step{
			{name: "first", keys: key("k1"), body: `{"amount":100}`, wantStatus: 201, wantRunsNow: 1},
			{keys: key("k1"), body: `{"amount":100}`, wantStatus: 201, wantReplays: "first", wantRunsNow: 1},
			{keys: key("k1"), body: `{"amount":100}`, wantStatus: 201, wantReplays: "first"},
		}, wantRuns: 1},
		{name: "quoted and bare forms are one key", steps: []step{
			{name: "first", keys: key(`k"1\`), wantStatus: 201},
			{keys: key(`"k\"1\\"`), wantStatus: 201, wantReplays: "first"},
		}, wantRuns: 1},
		{name: "other methods pass through", steps: []step{
			{method: http.MethodGet, wantStatus: 201},
			{method: http.MethodPut, keys: key("k1"), wantStatus: 201},
			{method: http.MethodPut, keys: key("k1"), wantStatus: 201},
		}, wantRuns: 3},
		{name: "PATCH is covered by default", steps: []step{
			{name: "first", method: http.MethodPatch, keys: key("k1"), wantStatus: 201},
			{method: http.MethodPatch, keys: key("k1"), wantStatus: 201, wantReplays: "first"},
		}, wantRuns: 1},
		{name: "configured methods", adjust: func(c *config) { c.Methods = []string{http.MethodPut} }, steps: []step{
			{name: "put", method: http.MethodPut, keys: key("k1"), wantStatus: 201},
			{method: http.MethodPut, keys: key("k1"), wantStatus: 201, wantReplays: "put"},
			{method: http.MethodPost, wantStatus: 201},
		}, wantRuns: 2},
		// The Once's MaxAttempts caps the runs of one key: the request
		// after the last is refused, and nothing runs.
		{name: "MaxAttempts of the Once", adjust: func(c *config) { c.MaxAttempts = 2 }, steps: []step{
			{path: "/fail", keys: key("k1"), wantStatus: 503},
			{path: "/fail", keys: key("k1"), wantStatus: 503},
			{path: "/fail", keys: key("k1"), wantStatus: 422, wantProblem: tooManyAttempts},
			{path: "/fail", keys: key("k1"), wantStatus: 422, wantProblem: tooManyAttempts},
			{path: "/fail", keys: key("k2"), wantStatus: 503},
		}, wantRuns: 3},
		{name: "missing key", steps: []step{
			{wantStatus: 400, wantProblem: keyMissing},
			{method: http.MethodPatch, wantStatus: 400, wantProblem: keyMissing},
		}, wantRuns: 0},
		{name: "missing key allowed when optional", adjust: func(c *config) { c.KeyOptional = true }, steps: []step{
			{wantStatus: 201}, {wantStatus: 201},
		}, wantRuns: 2},
		{name: "invalid keys", steps: []step{
			{keys: key(""), wantStatus: 400, wantProblem: keyInvalid},
			{keys: key("k\x01"), wantStatus: 400, wantProblem: keyInvalid},
			{keys: key("k\x7f"), wantStatus: 400, wantProblem: keyInvalid},
			{keys: key("clé"), wantStatus: 400, wantProblem: keyInvalid},
			{keys: key(`"unterminated`), wantStatus: 400, wantProblem: keyInvalid},
			{keys: key(`"bad\escape"`), wantStatus: 400, wantProblem: keyInvalid},
			{keys: key(`""`), wantStatus: 400, wantProblem: keyInvalid},
			{keys: []string{"k1", "k2"}, wantStatus: 400, wantProblem: keyInvalid},
		}, wantRuns: 0},
		{name: "long keys and printable punctuation accepted", steps: []step{
			{name: "long", keys: key(long), wantStatus: 201},
			{keys: key(long), wantStatus: 201, wantReplays: "long"},
			// Keys over 200 bytes are stored hashed: one differing only in
			// its last byte is another key.
			{name: "longer", keys: key(long + "k"), wantStatus: 201},
			{keys: key(long + "k"), wantStatus: 201, wantReplays: "longer"},
			{name: "longer 2", keys: key(long + "j"), wantStatus: 201},
			{keys: key(long + "j"), wantStatus: 201, wantReplays: "longer 2"},
			{keys: key(` ~!"#$%&'()*+-./:;<=>?@[\]^_{|}`), wantStatus: 201},
			{name: "quoted comma", keys: key(`" ~!\"#$%&'()*+,-./:;<=>?@[\\]^_{|}"`), wantStatus: 201},
			{keys: key(`" ~!\"#$%&'()*+,-./:;<=>?@[\\]^_{|}"`), wantStatus: 201, wantReplays: "quoted comma"},
		}, wantRuns: 5},
		// A proxy may merge two Idempotency-Key lines into one, joined by a
		// comma: such a value is refused rather than taken for one key.
		{name: "unquoted comma refused", steps: []step{
			{keys: key("k1, k2"), wantStatus: 400, wantProblem: keyInvalid},
			{keys: key("k1,k2"), wantStatus: 400, wantProblem: keyInvalid},
			{keys: key(`"k1", "k2"`), wantStatus: 400, wantProblem: keyInvalid},
			{name: "quoted", keys: key(`"k1,k2"`), wantStatus: 201},
			{keys: key(`"k1,k2"`), wantStatus: 201, wantReplays: "quoted"},
		}, wantRuns: 1},
		{name: "request body over the bound", adjust: func(c *config) { c.MaxRequestBody = 16 }, steps: []step{
			{keys: key("k1"), body: strings.Repeat("b", 17), wantStatus: 413, wantProblem: bodyTooLarge},
			{name: "fits", keys: key("k1"), body: strings.Repeat("b", 16), wantStatus: 201},
			{keys: key("k1"), body: strings.Repeat("b", 16), wantStatus: 201, wantReplays: "fits"},
		}, wantRuns: 1},
		{name: "same key different body", steps: []step{
			{keys: key("k1"), body: `{"amount":100}`, wantStatus: 201},
			{keys: key("k1"), body: `{"amount":999}`, wantStatus: 422, wantProblem: keyReused},
		}, wantRuns: 1},
		{name: "same key different path", steps: []step{
			{keys: key("k1"), wantStatus: 201},
			{keys: key("k1"), path: "/bad", wantStatus: 422, wantProblem: keyReused},
			{keys: key("k1"), path: "/pay?x=1", wantStatus: 422, wantProblem: keyReused},
		}, wantRuns: 1},
		{name: "same key different method", steps: []step{
			{keys: key("k1"), wantStatus: 201},
			{keys: key("k1"), method: http.MethodPatch, wantStatus: 422, wantProblem: keyReused},
		}, wantRuns: 1},
		{name: "handler 4xx is completed and replayed", steps: []step{
			{name: "bad", keys: key("k1"), path: "/bad", wantStatus: 400},
			{keys: key("k1"), path: "/bad", wantStatus: 400, wantReplays: "bad"},
		}, wantRuns: 1},
		{name: "handler 5xx is failed and runs again", steps: []step{
			{keys: key("k1"), path: "/fail", wantStatus: 503, wantRunsNow: 1},
			{keys: key("k1"), path: "/fail", wantStatus: 503, wantRunsNow: 2},
			{keys: key("k1"), path: "/pay", wantStatus: 422, wantProblem: keyReused},
		}, wantRuns: 2},
		{name: "panic is failed, re-panicked, and runs again", steps: []step{
			{keys: key("k1"), path: "/panic", wantPanic: true, wantRunsNow: 1},
			{keys: key("k1"), path: "/panic", wantPanic: true, wantRunsNow: 2},
		}, wantRuns: 2},
		{name: "in progress", steps: []step{
			{keys: key("k1"), path: "/block", blocked: true},
			{keys: key("k1"), path: "/block", wantStatus: 409, wantProblem: inProgress},
			{keys: key("k1"), path: "/pay", wantStatus: 422, wantProblem: keyReused},
		}, wantRuns: 1},
		{name: "response over the bound", adjust: func(c *config) { c.MaxOutputSize = 1024 }, steps: []step{
			{keys: key("k1"), path: "/big", wantStatus: 201},
			{keys: key("k1"), path: "/big", wantStatus: 410, wantProblem: responseNotStored},
		}, wantRuns: 1},
		{name: "tenants are apart", steps: []step{
			{name: "a", tenant: "a", keys: key("k1"), wantStatus: 201, wantRunsNow: 1},
			{name: "b", tenant: "b", keys: key("k1"), wantStatus: 201, wantRunsNow: 2},
			{tenant: "a", keys: key("k1"), wantStatus: 201, wantReplays: "a"},
			{tenant: "b", keys: key("k1"), wantStatus: 201, wantReplays: "b"},
		}, wantRuns: 2},
		{name: "scope and key never run together", steps: []step{
			{name: "ab", tenant: "a:b", keys: key("c"), wantStatus: 201, wantRunsNow: 1},
			{name: "a", tenant: "a", keys: key("b:c"), wantStatus: 201, wantRunsNow: 2},
			{tenant: "a:b", keys: key("c"), wantStatus: 201, wantReplays: "ab"},
			{tenant: "a", keys: key("b:c"), wantStatus: 201, wantReplays: "a"},
		}, wantRuns: 2},
	}
	eachStore(t, func(t *testing.T, kind storeKind) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				store, prefix := kind.New(t)
				api := newPayments()
				h := newMiddleware(t, store, prefix, tc.adjust).Handler(api)
				seen := map[string]result{}
				var background []chan result
				for i, s := range tc.steps {
					req := newRequest(s)
					if s.blocked {
						done := make(chan result, 1)
						go func() { done <- serve(h, req) }()
						<-api.started
						background = append(background, done)
						continue
					}
					got := serve(h, req)
					if s.wantPanic {
						require.NotNil(t, got.panicked, "step %d: want the handler's panic to reach net/http", i)
						continue
					}
					require.Nil(t, got.panicked, "step %d", i)
					require.Equal(t, s.wantStatus, got.status, "step %d: body %s", i, got.body)
					if s.wantProblem != nil {
						requireProblem(t, got, s.wantStatus, s.wantProblem)
					} else {
						assert.NotEqual(t, "application/problem+json", got.header.Get("Content-Type"), "step %d", i)
					}
					if s.wantReplays != "" {
						requireReplay(t, seen[s.wantReplays], got)
					} else {
						assert.Empty(t, got.header.Get(httpidem.ReplayedHeader), "step %d", i)
					}
					if s.wantRunsNow > 0 {
						assert.Equal(t, s.wantRunsNow, api.runs.Load(), "step %d", i)
					}
					if s.name != "" {
						seen[s.name] = got
					}
				}
				close(api.release)
				for _, done := range background {
					got := <-done
					assert.Equal(t, http.StatusCreated, got.status)
				}
				assert.Equal(t, tc.wantRuns, api.runs.Load(), "handler runs")
			})
		}
	})
}

func newRequest(s step) *http.Request {
	method, path := s.method, s.path
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = "/pay"
	}
	req := httptest.NewRequest(method, path, strings.NewReader(s.body))
	for _, k := range s.keys {
		req.Header.Add("Idempotency-Key", k)
	}
	if s.tenant != "" {
		req.Header.Set("X-Tenant", s.tenant)
	}
	return req
}

// problemKind is an answer of the middleware that the tests tell apart:
// its problem type (the outcome's name) and a part of its detail.
type problemKind struct{ typ, detail string }

var (
	keyMissing            = &problemKind{"missing_key", "requires an Idempotency-Key header"}
	keyInvalid            = &problemKind{"missing_key", "The Idempotency-Key header"}
	bodyTooLarge          = &problemKind{"body_too_large", "The request body exceeds"}
	bodyUnreadable        = &problemKind{"body_unreadable", "could not be read in full"}
	keyReused             = &problemKind{"key_reused", "first used for a different request"}
	inProgress            = &problemKind{"in_progress", "is still being processed"}
	tooManyAttempts       = &problemKind{"too_many_attempts", "failed too many times"}
	responseNotStored     = &problemKind{"output_not_stored", "too large to store"}
	storeUnavailable      = &problemKind{"store_unavailable", "store cannot be reached"}
	storedResponseCorrupt = &problemKind{"corrupt_record", "its stored response cannot be read"}
	recordCorrupt         = &problemKind{"corrupt_record", "idempotency record of this key cannot be read"}
)

// problemTypeBase starts the type of every problem.
const problemTypeBase = "https://github.com/idempotency/watermill-idempotency/blob/main/docs/GUARANTEES.md#"

// requireProblem checks an RFC 9457 answer of the middleware.
func requireProblem(t *testing.T, got result, status int, pk *problemKind) {
	t.Helper()
	require.Equal(t, "application/problem+json", got.header.Get("Content-Type"))
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal([]byte(got.body), &p), got.body)
	assert.Equal(t, problemTypeBase+pk.typ, p.Type)
	assert.Equal(t, status, p.Status)
	assert.NotEmpty(t, p.Title)
	assert.Contains(t, p.Detail, pk.detail)
	if status == http.StatusConflict || status == http.StatusServiceUnavailable {
		assert.Equal(t, "1", got.header.Get("Retry-After"))
	}
}

// requireReplay checks that got is orig byte for byte, plus the replay marker.
func requireReplay(t *testing.T, orig, got result) {
	t.Helper()
	require.NotZero(t, orig.status, "the replayed step must be named and answered")
	want := orig.header.Clone()
	want.Set(httpidem.ReplayedHeader, "true")
	assert.Equal(t, orig.status, got.status)
	assert.Equal(t, want, got.header)
	assert.Equal(t, orig.body, got.body)
}

func TestNew(t *testing.T) {
	store, prefix := storeKinds[0].New(t)
	_, err := build(config{Config: httpidem.Config{SingleTenant: true}})
	require.ErrorIs(t, err, idempotency.ErrInvalidConfig, "the Once needs a Store")
	once := func(c idempotency.OnceConfig) idempotency.OnceConfig { c.Store = store; return c }
	single := httpidem.Config{SingleTenant: true}
	for name, cfg := range map[string]config{
		// The Once's settings, checked by the Once.
		"negative lease":     {OnceConfig: once(idempotency.OnceConfig{LeaseTTL: -time.Second}), Config: single},
		"tiny lease":         {OnceConfig: once(idempotency.OnceConfig{LeaseTTL: time.Millisecond}), Config: single},
		"negative TTL":       {OnceConfig: once(idempotency.OnceConfig{CompletedTTL: -1}), Config: single},
		"negative failed":    {OnceConfig: once(idempotency.OnceConfig{FailedTTL: -1}), Config: single},
		"negative timeout":   {OnceConfig: once(idempotency.OnceConfig{StoreTimeout: -1}), Config: single},
		"negative resp body": {OnceConfig: once(idempotency.OnceConfig{MaxOutputSize: -1}), Config: single},
		"forever TTL":        {OnceConfig: once(idempotency.OnceConfig{CompletedTTL: time.Duration(math.MaxInt64)}), Config: single},
		"forever failed":     {OnceConfig: once(idempotency.OnceConfig{FailedTTL: time.Duration(math.MaxInt64)}), Config: single},
		"forever lease":      {OnceConfig: once(idempotency.OnceConfig{LeaseTTL: time.Duration(math.MaxInt64)}), Config: single},
	} {
		_, err := build(cfg)
		assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, name)
	}
	o, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	for name, cfg := range map[string]httpidem.Config{
		"negative retry":    {SingleTenant: true, RetryAfter: -1},
		"negative req body": {SingleTenant: true, MaxRequestBody: -1},
		"prefix separator":  {SingleTenant: true, KeyPrefix: "shop:billing"},
		"bad header":        {SingleTenant: true, Header: "Idempotency Key"},
		"bad method":        {SingleTenant: true, Methods: []string{"PO ST"}},
		"no scope":          {},
		"scope and single":  {Scope: tenantScope, SingleTenant: true},
	} {
		_, err := httpidem.New(o, &cfg)
		assert.ErrorIs(t, err, httpidem.ErrInvalidConfig, name)
	}

	// Zero fields stand for defaults, but the scope is a choice to make.
	_, err = httpidem.New(o, &httpidem.Config{Scope: tenantScope})
	assert.NoError(t, err)
	_, err = httpidem.New(o, &httpidem.Config{SingleTenant: true})
	assert.NoError(t, err)
	_, err = httpidem.New(o, nil)
	assert.ErrorIs(t, err, httpidem.ErrInvalidConfig, "a nil Config has no scope")
	_, err = httpidem.New(nil, &httpidem.Config{SingleTenant: true})
	assert.ErrorIs(t, err, httpidem.ErrInvalidConfig, "a nil Once")

	// Every problem at once, in the documented order, each an
	// ErrInvalidConfig.
	_, err = httpidem.New(o, &httpidem.Config{MaxRequestBody: -1, Header: "Idempotency Key", Methods: []string{"PO ST", "GET"}})
	adaptertest.RequireProblems(t, err, `httpidem: invalid config: Scope is required (the tenant of a request); set SingleTenant instead only when one client calls this service
httpidem: invalid config: MaxRequestBody is -1, must not be negative
httpidem: invalid config: Header "Idempotency Key" is not a header name
httpidem: invalid config: method "PO ST" is not a method name`, httpidem.ErrInvalidConfig, nil)

	// The config is copied: changing the caller's slice later changes nothing.
	methods := []string{http.MethodPut}
	m, err := httpidem.New(o, &httpidem.Config{KeyPrefix: prefix, SingleTenant: true, Methods: methods})
	require.NoError(t, err)
	methods[0] = http.MethodPost
	api := newPayments()
	got := serve(m.Handler(api), newRequest(step{}))
	assert.Equal(t, http.StatusCreated, got.status, "POST must still pass through")
	got = serve(m.Handler(api), newRequest(step{method: http.MethodPut}))
	assert.Equal(t, http.StatusBadRequest, got.status, "PUT must still require a key")
}

// TestBodyUnreadable: a request body that fails before its end is answered
// 400 body_unreadable, the handler never runs, and the key stays free.
func TestBodyUnreadable(t *testing.T) {
	store, prefix := storeKinds[0].New(t)
	m := newMiddleware(t, store, prefix, nil)
	api := newPayments()
	req := newRequest(step{keys: key("k1"), tenant: "t1"})
	req.Body = io.NopCloser(io.MultiReader(strings.NewReader(`{"amount":`), iotest.ErrReader(errors.New("connection reset"))))
	requireProblem(t, serve(m.Handler(api), req), http.StatusBadRequest, bodyUnreadable)
	got := serve(m.Handler(api), newRequest(step{keys: key("k1"), tenant: "t1", body: `{"amount":1}`}))
	assert.Equal(t, http.StatusCreated, got.status, "the key is free after an unreadable body")
}
