package idemprom_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/idemprom"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

func TestMetricsCountOutcomesAndLatencies(t *testing.T) {
	metrics := idemprom.New("svc")
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(metrics))

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(memstore.Config{}), Observer: metrics})
	require.NoError(t, err)
	idem, err := idempotency.New(once, nil)
	require.NoError(t, err)
	fail := true
	h := idem.Middleware(func(*message.Message) ([]*message.Message, error) {
		if fail {
			fail = false
			return nil, errors.New("once")
		}
		return nil, nil
	})
	for range 3 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("requestId", "r")
		_, _ = h(msg)
	}
	expected := `
# HELP svc_idempotency_outcomes_total Deliveries handled by the idempotency middleware, by handler and outcome.
# TYPE svc_idempotency_outcomes_total counter
svc_idempotency_outcomes_total{handler="",outcome="complete_failed"} 0
svc_idempotency_outcomes_total{handler="",outcome="duplicate"} 1
svc_idempotency_outcomes_total{handler="",outcome="handler_failed"} 1
svc_idempotency_outcomes_total{handler="",outcome="lease_lost"} 0
svc_idempotency_outcomes_total{handler="",outcome="output_not_stored"} 0
svc_idempotency_outcomes_total{handler="",outcome="processed"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "svc_idempotency_outcomes_total"))
	// claim ×3, fail ×1, complete ×1
	assert.Equal(t, 3, testutil.CollectAndCount(metrics, "svc_idempotency_store_duration_seconds"), "claim, fail and complete series")
	problems, err := testutil.CollectAndLint(metrics)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestCacheLookupsCounted: every cache lookup is counted by handler and
// result.
func TestCacheLookupsCounted(t *testing.T) {
	metrics := idemprom.New("svc")
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(metrics))
	var obs idempotency.Observer = metrics
	obs.CacheLookup("orders", true)
	obs.CacheLookup("orders", true)
	obs.CacheLookup("orders", false)
	expected := `
# HELP svc_idempotency_cache_lookups_total Claims looked up in the cache of completed keys, by handler and result (hit or miss).
# TYPE svc_idempotency_cache_lookups_total counter
svc_idempotency_cache_lookups_total{handler="orders",result="hit"} 2
svc_idempotency_cache_lookups_total{handler="orders",result="miss"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "svc_idempotency_cache_lookups_total"))
	problems, err := testutil.CollectAndLint(metrics)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestAlertedSeriesStartAtZero: the outcomes the alert rules page on at
// their first occurrence exist at 0 from a handler's first outcome, so that
// increase() sees their first occurrence as 0 → 1. Without them the series
// appeared at 1, which increase(...[5m]) > 0 never reports.
func TestAlertedSeriesStartAtZero(t *testing.T) {
	metrics := idemprom.New("svc")
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(metrics))
	metrics.Outcome(context.Background(), idempotency.OutcomeDetails{Handler: "bill", Outcome: idempotency.OutcomeProcessed})
	metrics.Outcome(context.Background(), idempotency.OutcomeDetails{Handler: "ship", Outcome: idempotency.OutcomeDuplicate})
	header := `
# HELP svc_idempotency_outcomes_total Deliveries handled by the idempotency middleware, by handler and outcome.
# TYPE svc_idempotency_outcomes_total counter
`
	expected := header + `svc_idempotency_outcomes_total{handler="bill",outcome="complete_failed"} 0
svc_idempotency_outcomes_total{handler="bill",outcome="lease_lost"} 0
svc_idempotency_outcomes_total{handler="bill",outcome="output_not_stored"} 0
svc_idempotency_outcomes_total{handler="bill",outcome="processed"} 1
svc_idempotency_outcomes_total{handler="ship",outcome="complete_failed"} 0
svc_idempotency_outcomes_total{handler="ship",outcome="duplicate"} 1
svc_idempotency_outcomes_total{handler="ship",outcome="lease_lost"} 0
svc_idempotency_outcomes_total{handler="ship",outcome="output_not_stored"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "svc_idempotency_outcomes_total"))

	metrics.Outcome(context.Background(), idempotency.OutcomeDetails{Handler: "bill", Outcome: idempotency.OutcomeOutputNotStored})
	expected = header + `svc_idempotency_outcomes_total{handler="bill",outcome="complete_failed"} 0
svc_idempotency_outcomes_total{handler="bill",outcome="lease_lost"} 0
svc_idempotency_outcomes_total{handler="bill",outcome="output_not_stored"} 1
svc_idempotency_outcomes_total{handler="bill",outcome="processed"} 1
svc_idempotency_outcomes_total{handler="ship",outcome="complete_failed"} 0
svc_idempotency_outcomes_total{handler="ship",outcome="duplicate"} 1
svc_idempotency_outcomes_total{handler="ship",outcome="lease_lost"} 0
svc_idempotency_outcomes_total{handler="ship",outcome="output_not_stored"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "svc_idempotency_outcomes_total"),
		"the occurrence counts 0 → 1")
}
