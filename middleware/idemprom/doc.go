// Package idemprom exports the idempotency middleware's outcomes and store
// latencies to Prometheus. It lives apart so that the middleware itself does
// not depend on the Prometheus client.
//
//	metrics := idemprom.New("myservice")
//	prometheus.MustRegister(metrics)
//	once, _ := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: metrics})
//
// Series (with the namespace prefix):
//   - idempotency_outcomes_total{handler, outcome}: one per delivery; the
//     outcomes are idempotency.Outcome values (processed, duplicate,
//     in_progress, handler_failed, store_unavailable, complete_failed, …).
//     A handler's first outcome also creates its complete_failed,
//     lease_lost and output_not_stored series at 0: increase() sees no
//     increase in a series' first sample, so an alert on a series born at 1
//     would miss a rare event's first occurrence. Only an occurrence that
//     is a handler's very first outcome since the process started is still
//     born at 1.
//   - idempotency_store_duration_seconds{op, result}: latency of every
//     store call; op is claim, renew, complete, fail or release, result ok
//     or error.
//   - idempotency_cache_lookups_total{handler, result}: one per claim while
//     the cache of completed keys is on (OnceConfig.CacheMaxBytes);
//     result is hit (answered from memory, no store call) or miss.
//
// Alert on complete_failed and lease_lost (a handler may run twice),
// output_not_stored (an output larger than MaxOutputSize was not stored,
// and is lost if its publish fails), store_unavailable (messages are
// nacked), and a growing rate of in_progress (handlers slower than the
// broker's redelivery); and on caller_gone (an HTTP, gRPC or Once.Do
// caller gave up before the store answered) only when it is most outcomes:
// callers whose deadlines are shorter than StoreTimeout see a store that is
// down as caller_gone, never store_unavailable.
//
// The repository's dashboards/idempotency.json is a Grafana dashboard of
// these series (outcomes per second by handler, duplicate ratio, in-progress
// nacks, store latency p50 and p99, complete_failed, lease_lost and
// output_not_stored), and
// dashboards/idempotency-alerts.yml holds Prometheus alert rules for them; a
// test keeps both in step with the names and labels here. Package idemotel
// records the same names and labels through OpenTelemetry.
package idemprom
