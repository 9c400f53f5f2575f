package idemotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// scopeName is the instrumentation scope of the Observer's meter.
const scopeName = "github.com/idempotency/watermill-idempotency/middleware/idemotel"

// The span attributes that Observer sets; see the package documentation.
const (
	attrKeyHash  attribute.Key = "idempotency.key_hash"
	attrScope    attribute.Key = "idempotency.scope"
	attrOutcome  attribute.Key = "idempotency.outcome"
	attrAttempt  attribute.Key = "idempotency.attempt"
	attrReplayed attribute.Key = "idempotency.replayed"
)

// The metric names, without Config.Namespace, as in package idemprom.
const (
	outcomesMetric      = "idempotency_outcomes_total"
	storeDurationMetric = "idempotency_store_duration_seconds"
	cacheLookupsMetric  = "idempotency_cache_lookups_total"
)

// storeBuckets are idemprom's histogram buckets, in seconds.
var storeBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// Config configures an Observer. The zero Config is valid.
type Config struct {
	// MeterProvider makes the meter. The default is otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Namespace and "_" start every metric name, as in idemprom. The default is none.
	Namespace string
}

// Observer is an [idempotency.Observer] for OpenTelemetry, safe for concurrent use.
type Observer struct {
	outcomes     metric.Int64Counter
	latency      metric.Float64Histogram
	cacheLookups metric.Int64Counter
	// hit and miss are the attribute of CacheLookup's result, built once.
	hit, miss attribute.KeyValue
}

var _ idempotency.Observer = (*Observer)(nil)

// New returns an Observer that records on cfg.MeterProvider.
func New(cfg Config) (*Observer, error) {
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	prefix := ""
	if cfg.Namespace != "" {
		prefix = cfg.Namespace + "_"
	}
	meter := mp.Meter(scopeName)
	outcomes, err := meter.Int64Counter(prefix+outcomesMetric,
		metric.WithDescription("Deliveries handled by the idempotency middleware, by handler and outcome."),
		metric.WithUnit("{delivery}"))
	if err != nil {
		return nil, fmt.Errorf("idemotel: counter %s: %w", prefix+outcomesMetric, err)
	}
	latency, err := meter.Float64Histogram(prefix+storeDurationMetric,
		metric.WithDescription("Latency of idempotency store calls, by operation and result."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(storeBuckets...))
	if err != nil {
		return nil, fmt.Errorf("idemotel: histogram %s: %w", prefix+storeDurationMetric, err)
	}
	cacheLookups, err := meter.Int64Counter(prefix+cacheLookupsMetric,
		metric.WithDescription("Claims looked up in the cache of completed keys, by handler and result (hit or miss)."),
		metric.WithUnit("{lookup}"))
	if err != nil {
		return nil, fmt.Errorf("idemotel: counter %s: %w", prefix+cacheLookupsMetric, err)
	}
	return &Observer{outcomes: outcomes, latency: latency, cacheLookups: cacheLookups,
		hit: attribute.String("result", "hit"), miss: attribute.String("result", "miss")}, nil
}

// Outcome counts the outcome and sets the attributes on ctx's span.
func (o *Observer) Outcome(ctx context.Context, d idempotency.OutcomeDetails) {
	o.count(ctx, d.Handler, d.Outcome)
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	if d.Key != "" {
		sum := sha256.Sum256([]byte(d.Key))
		attrs = append(attrs, attrKeyHash.String(hex.EncodeToString(sum[:])))
	}
	attrs = append(attrs, attrScope.String(d.Handler), attrOutcome.String(string(d.Outcome)))
	if d.Attempt > 0 {
		attrs = append(attrs, attrAttempt.Int(d.Attempt))
	}
	attrs = append(attrs, attrReplayed.Bool(d.Outcome == idempotency.OutcomeDuplicate))
	span.SetAttributes(attrs...)
}

func (o *Observer) count(ctx context.Context, handler string, outcome idempotency.Outcome) {
	o.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("handler", handler), attribute.String("outcome", string(outcome))))
}

// StoreLatency implements idempotency.Observer.
func (o *Observer) StoreLatency(op string, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	o.latency.Record(context.Background(), d.Seconds(), metric.WithAttributes(attribute.String("op", string(op)), attribute.String("result", result)))
}

// CacheLookup implements idempotency.Observer.
func (o *Observer) CacheLookup(handler string, hit bool) {
	result := o.miss
	if hit {
		result = o.hit
	}
	o.cacheLookups.Add(context.Background(), 1, metric.WithAttributes(attribute.String("handler", handler), result))
}
