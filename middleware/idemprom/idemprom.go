package idemprom

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Metrics is an [idempotency.Observer] and a [prometheus.Collector].
type Metrics struct {
	outcomes     *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	cacheLookups *prometheus.CounterVec
	// handlers holds the handler labels whose alerted series exist.
	handlers sync.Map
}

// alerted are the outcomes alerted on at their first occurrence: each is
// created at 0 with its handler's first outcome, since increase() cannot
// see a series' first sample.
var alerted = []idempotency.Outcome{
	idempotency.OutcomeCompleteFailed,
	idempotency.OutcomeLeaseLost,
	idempotency.OutcomeOutputNotStored,
}

var (
	_ idempotency.Observer = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// subsystem follows the namespace in every metric name.
const subsystem = "idempotency"

// New returns unregistered metrics named after namespace, which may be empty.
func New(namespace string) *Metrics {
	return &Metrics{
		outcomes: newCounterVec(namespace, "outcomes_total",
			"Deliveries handled by the idempotency middleware, by handler and outcome.",
			"handler", "outcome"),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace,
			Subsystem: subsystem,
			Name:      "store_duration_seconds",
			Help:      "Latency of idempotency store calls, by operation and result.",
			Buckets:   []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"op", "result"}),
		cacheLookups: newCounterVec(namespace, "cache_lookups_total",
			"Claims looked up in the cache of completed keys, by handler and result (hit or miss).",
			"handler", "result"),
	}
}

// newCounterVec returns a counter of the idempotency subsystem.
func newCounterVec(namespace, name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Subsystem: subsystem,
		Name:      name,
		Help:      help,
	}, labels)
}

// Outcome implements idempotency.Observer.
func (m *Metrics) Outcome(_ context.Context, d idempotency.OutcomeDetails) {
	handler, outcome := d.Handler, d.Outcome
	if _, seen := m.handlers.Load(handler); !seen {
		if _, seen = m.handlers.LoadOrStore(handler, struct{}{}); !seen {
			for _, o := range alerted {
				m.outcomes.WithLabelValues(handler, string(o)) // at 0
			}
		}
	}
	m.outcomes.WithLabelValues(handler, string(outcome)).Inc()
}

// StoreLatency implements idempotency.Observer.
func (m *Metrics) StoreLatency(op string, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.latency.WithLabelValues(op, result).Observe(d.Seconds())
}

// CacheLookup implements idempotency.Observer.
func (m *Metrics) CacheLookup(handler string, hit bool) {
	result := "miss"
	if hit {
		result = "hit"
	}
	m.cacheLookups.WithLabelValues(handler, result).Inc()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.outcomes.Describe(ch)
	m.latency.Describe(ch)
	m.cacheLookups.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.outcomes.Collect(ch)
	m.latency.Collect(ch)
	m.cacheLookups.Collect(ch)
}
