package idemotel_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idemotel"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/idemprom"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	obs    *idemotel.Observer
}

func newTelemetry(t *testing.T, namespace string) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		_ = tel.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	obs, err := idemotel.New(idemotel.Config{MeterProvider: mp, Namespace: namespace})
	require.NoError(t, err)
	tel.obs = obs
	return tel
}

// spanAttrs returns the attributes of the ended span named name.
func (tel *telemetry) spanAttrs(t *testing.T, name string) map[attribute.Key]attribute.Value {
	t.Helper()
	for _, s := range tel.spans.Ended() {
		if s.Name() == name {
			m := map[attribute.Key]attribute.Value{}
			for _, kv := range s.Attributes() {
				m[kv.Key] = kv.Value
			}
			return m
		}
	}
	t.Fatalf("no ended span %q", name)
	return nil
}

// counts returns the outcome counter's values by "handler/outcome", and the
// histogram's counts by "op/result".
func (tel *telemetry) collect(t *testing.T, prefix string) (outcomes, latencies map[string]int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	outcomes, latencies = map[string]int64{}, map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, idemotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			switch m.Name {
			case prefix + idemotel.OutcomesMetric:
				sum, ok := m.Data.(metricdata.Sum[int64])
				require.True(t, ok, "%s is a Sum[int64]", m.Name)
				assert.True(t, sum.IsMonotonic)
				for _, dp := range sum.DataPoints {
					h, _ := dp.Attributes.Value("handler")
					o, _ := dp.Attributes.Value("outcome")
					assert.Equal(t, 2, dp.Attributes.Len(), "labels handler and outcome only")
					outcomes[h.AsString()+"/"+o.AsString()] += dp.Value
				}
			case prefix + idemotel.StoreDurationMetric:
				hist, ok := m.Data.(metricdata.Histogram[float64])
				require.True(t, ok, "%s is a Histogram[float64]", m.Name)
				assert.Equal(t, "s", m.Unit)
				for _, dp := range hist.DataPoints {
					op, _ := dp.Attributes.Value("op")
					res, _ := dp.Attributes.Value("result")
					assert.Equal(t, 2, dp.Attributes.Len(), "labels op and result only")
					latencies[op.AsString()+"/"+res.AsString()] += int64(dp.Count)
				}
			case prefix + idemotel.CacheLookupsMetric: // see TestCacheLookupsCounted
			default:
				t.Errorf("unexpected metric %q", m.Name)
			}
		}
	}
	return outcomes, latencies
}

func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// A processed, a failed and a duplicate message each carry the documented
// attributes on the span of their message's context (as a tracing
// middleware before this one or the subscriber leaves it in msg.Context()),
// and the metrics count them under idemprom's names and labels.
func TestWatermillSpansAndMetrics(t *testing.T) {
	tel := newTelemetry(t, "svc")
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil), Observer: tel.obs})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{Scope: ordersScope})
	require.NoError(t, err)
	fail := map[string]bool{"failing": true}
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if fail[msg.Metadata.Get("requestId")] {
			return nil, errors.New("handler failed")
		}
		return nil, nil
	})
	tracer := tel.tp.Tracer("test")
	deliver := func(spanName, requestID string) {
		ctx := context.Background()
		ctx, span := tracer.Start(ctx, spanName)
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
		msg.Metadata.Set("requestId", requestID)
		msg.SetContext(ctx)
		_, _ = h(msg)
		span.End()
	}
	deliver("processed", "ok-1")
	deliver("failed", "failing")
	deliver("duplicate", "ok-1")

	for _, tc := range []struct {
		span, key, outcome string
		attempt            int64
		replayed           bool
	}{
		{"processed", "idem:orders:ok-1", "processed", 1, false},
		{"failed", "idem:orders:failing", "handler_failed", 1, false},
		{"duplicate", "idem:orders:ok-1", "duplicate", 1, true},
	} {
		attrs := tel.spanAttrs(t, tc.span)
		assert.Equal(t, keyHash(tc.key), attrs[idemotel.AttrKeyHash].AsString(), tc.span)
		assert.Equal(t, "orders", attrs[idemotel.AttrScope].AsString(), tc.span)
		assert.Equal(t, tc.outcome, attrs[idemotel.AttrOutcome].AsString(), tc.span)
		assert.Equal(t, tc.attempt, attrs[idemotel.AttrAttempt].AsInt64(), tc.span)
		assert.Equal(t, tc.replayed, attrs[idemotel.AttrReplayed].AsBool(), tc.span)
		assert.Equal(t, attribute.BOOL, attrs[idemotel.AttrReplayed].Type(), "%s: replayed is set, also when false", tc.span)
	}

	outcomes, latencies := tel.collect(t, "svc_")
	assert.Equal(t, map[string]int64{"orders/processed": 1, "orders/handler_failed": 1, "orders/duplicate": 1}, outcomes)
	assert.Equal(t, map[string]int64{"claim/ok": 3, "complete/ok": 1, "fail/ok": 1}, latencies)
}

// A second failure of the same key carries attempt 2; a message without a key
// has no key hash and no attempt.
func TestAttemptsAndMissingKey(t *testing.T) {
	tel := newTelemetry(t, "")
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil), Observer: tel.obs})
	require.NoError(t, err)
	idem, err := idempotency.New(once, nil)
	require.NoError(t, err)
	h := idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("no") })
	tracer := tel.tp.Tracer("test")
	for i, id := range []string{"k", "k", ""} {
		ctx, span := tracer.Start(context.Background(), []string{"first", "second", "nokey"}[i])
		msg := message.NewMessage(id, nil)
		msg.SetContext(ctx)
		_, _ = h(msg)
		span.End()
	}
	assert.Equal(t, int64(2), tel.spanAttrs(t, "second")[idemotel.AttrAttempt].AsInt64())
	nokey := tel.spanAttrs(t, "nokey")
	assert.Equal(t, "missing_key", nokey[idemotel.AttrOutcome].AsString())
	assert.NotContains(t, nokey, idemotel.AttrKeyHash)
	assert.NotContains(t, nokey, idemotel.AttrAttempt)
	outcomes, _ := tel.collect(t, "")
	assert.Equal(t, map[string]int64{"/handler_failed": 2, "/missing_key": 1}, outcomes)
}

// Behind otelhttp, the attributes land on the request's server span.
func TestHTTPServerSpan(t *testing.T) {
	tel := newTelemetry(t, "")
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil), Observer: tel.obs})
	require.NoError(t, err)
	mw, err := httpidem.New(once, &httpidem.Config{SingleTenant: true})
	require.NoError(t, err)
	status := http.StatusCreated
	app := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	srv := otelhttp.NewHandler(app, "payments", otelhttp.WithTracerProvider(tel.tp),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Header.Get("X-Span") }))
	send := func(span, key string) int {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Span", span)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		return rec.Code
	}
	require.Equal(t, http.StatusCreated, send("first", "pay-1"))
	require.Equal(t, http.StatusCreated, send("repeat", "pay-1"))
	status = http.StatusInternalServerError
	require.Equal(t, http.StatusInternalServerError, send("broken", "pay-2"))

	first, repeat, broken := tel.spanAttrs(t, "first"), tel.spanAttrs(t, "repeat"), tel.spanAttrs(t, "broken")
	assert.Equal(t, "processed", first[idemotel.AttrOutcome].AsString())
	assert.False(t, first[idemotel.AttrReplayed].AsBool())
	assert.Equal(t, "duplicate", repeat[idemotel.AttrOutcome].AsString())
	assert.True(t, repeat[idemotel.AttrReplayed].AsBool())
	assert.Equal(t, first[idemotel.AttrKeyHash], repeat[idemotel.AttrKeyHash], "the same stored key")
	assert.Len(t, first[idemotel.AttrKeyHash].AsString(), 64)
	assert.Equal(t, "handler_failed", broken[idemotel.AttrOutcome].AsString())
	assert.Equal(t, int64(1), broken[idemotel.AttrAttempt].AsInt64())
	assert.Equal(t, "http", broken[idemotel.AttrScope].AsString())
	assert.NotEqual(t, first[idemotel.AttrKeyHash], broken[idemotel.AttrKeyHash])
}

// Once.Do puts the attributes on its caller's span; an Outcome whose
// context has no span only counts.
func TestOnceDoAndPlainOutcome(t *testing.T) {
	tel := newTelemetry(t, "")
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil), Observer: tel.obs})
	require.NoError(t, err)
	ctx, span := tel.tp.Tracer("test").Start(context.Background(), "job")
	_, err = once.Do(ctx, "job-1", func(context.Context) ([]byte, error) { return nil, nil })
	require.NoError(t, err)
	span.End()
	attrs := tel.spanAttrs(t, "job")
	assert.Equal(t, keyHash("job-1"), attrs[idemotel.AttrKeyHash].AsString())
	assert.Equal(t, "once", attrs[idemotel.AttrScope].AsString())

	tel.obs.Outcome(context.Background(), idempotency.OutcomeDetails{Handler: "once", Outcome: idempotency.OutcomeLeaseLost})
	outcomes, _ := tel.collect(t, "")
	assert.Equal(t, map[string]int64{"once/processed": 1, "once/lease_lost": 1}, outcomes)
}

// The instrument names are idemprom's series names, namespace included.
func TestNamesMatchIdemprom(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	prom := idemprom.New("svc")
	require.NoError(t, reg.Register(prom))
	prom.Outcome(context.Background(), idempotency.OutcomeDetails{Handler: "h", Outcome: idempotency.OutcomeProcessed})
	prom.StoreLatency("claim", 1, nil)
	prom.CacheLookup("h", true)
	families, err := reg.Gather()
	require.NoError(t, err)
	var promNames []string
	for _, f := range families {
		promNames = append(promNames, f.GetName())
	}

	tel := newTelemetry(t, "svc")
	tel.obs.Outcome(context.Background(), idempotency.OutcomeDetails{Handler: "h", Outcome: idempotency.OutcomeProcessed})
	tel.obs.StoreLatency("claim", 1, nil)
	tel.obs.CacheLookup("h", true)
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	var otelNames []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			otelNames = append(otelNames, m.Name)
		}
	}
	sort.Strings(promNames)
	sort.Strings(otelNames)
	assert.Equal(t, promNames, otelNames)
}

func ordersScope(*message.Message) string { return "orders" }

// TestCacheLookupsCounted: every cache lookup is counted by handler and
// result, as idemprom labels them.
func TestCacheLookupsCounted(t *testing.T) {
	tel := newTelemetry(t, "")
	tel.obs.CacheLookup("orders", true)
	tel.obs.CacheLookup("orders", true)
	tel.obs.CacheLookup("orders", false)
	tel.obs.CacheLookup("invoices", false)
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != idemotel.CacheLookupsMetric {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			require.True(t, ok, "%s is a Sum[int64]", m.Name)
			assert.True(t, sum.IsMonotonic)
			assert.Equal(t, "{lookup}", m.Unit)
			for _, dp := range sum.DataPoints {
				h, _ := dp.Attributes.Value("handler")
				r, _ := dp.Attributes.Value("result")
				assert.Equal(t, 2, dp.Attributes.Len(), "labels handler and result only")
				got[h.AsString()+"/"+r.AsString()] += dp.Value
			}
		}
	}
	assert.Equal(t, map[string]int64{"orders/hit": 2, "orders/miss": 1, "invoices/miss": 1}, got)
}
