// Package idemprom exports the outcomes and store latencies of
// [idempotency.Once] to Prometheus. The core does not depend on the
// Prometheus client.
//
//	metrics := idemprom.New("myservice")
//	prometheus.MustRegister(metrics)
//	once, _ := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: metrics})
//
// Series, with the namespace prefix:
//
//   - idempotency_outcomes_total{handler, outcome}: one per delivery. A
//     handler's first outcome creates its complete_failed, lease_lost and
//     output_not_stored series at 0, so increase() sees their first event.
//   - idempotency_store_duration_seconds{op, result}: each store call; op
//     is claim, renew, complete, fail or release, result ok or error.
//   - idempotency_cache_lookups_total{handler, result}: one per claim while
//     the cache is on; result is hit or miss.
//
// Alert on complete_failed and lease_lost (a handler may run twice),
// output_not_stored (lost if its publish fails), store_unavailable, and a
// growing rate of in_progress. Alert on caller_gone only when it is most
// outcomes: callers with deadlines under StoreTimeout see an outage as it.
//
// dashboards/ holds a Grafana dashboard and Prometheus alert rules for these
// series; a test keeps them in step with this package.
package idemprom
