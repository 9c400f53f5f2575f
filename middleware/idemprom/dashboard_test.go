package idemprom_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/idemprom"
)

// The dashboard and the alert rules in dashboards/ query only series and
// labels that this package exports, and only outcomes the middleware reports:
// renaming one here fails this test until they follow.

const (
	dashboardFile = "../../dashboards/idempotency.json"
	alertsFile    = "../../dashboards/idempotency-alerts.yml"
)

// exported returns the series names idemprom exposes (a histogram's as
// _bucket, _sum and _count) and their label names.
func exported(t *testing.T) (names, labels map[string]bool) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New("")
	require.NoError(t, reg.Register(m))
	m.Outcome(context.Background(), idempotency.OutcomeDetails{Handler: "h", Outcome: idempotency.OutcomeProcessed})
	m.StoreLatency("claim", time.Millisecond, nil)
	families, err := reg.Gather()
	require.NoError(t, err)
	names, labels = map[string]bool{}, map[string]bool{}
	for _, f := range families {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
			labels["le"] = true
		default:
			names[f.GetName()] = true
		}
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				labels[l.GetName()] = true
			}
		}
	}
	return names, labels
}

// outcomes are every idempotency.Outcome.
var outcomes = map[string]bool{}

func init() {
	for _, o := range []idempotency.Outcome{idempotency.OutcomeProcessed, idempotency.OutcomeHandlerFailed,
		idempotency.OutcomeDuplicate, idempotency.OutcomeInProgress, idempotency.OutcomeMissingKey,
		idempotency.OutcomeTooManyAttempts, idempotency.OutcomeKeyReused, idempotency.OutcomeStoreUnavailable,
		idempotency.OutcomeCallerGone, idempotency.OutcomeFailOpen, idempotency.OutcomeCompleteFailed, idempotency.OutcomeLeaseLost,
		idempotency.OutcomeCorruptRecord, idempotency.OutcomeOutputNotStored} {
		outcomes[string(o)] = true
	}
}

var (
	// A metric name is an identifier followed by a selector or a range.
	metricRef = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]`)
	// Label names in matchers and in by/without clauses.
	matcherRef = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	groupRef   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	outcomeRef = regexp.MustCompile(`outcome\s*=~?\s*"([^"]*)"`)
	quantile   = regexp.MustCompile(`histogram_quantile\(\s*([0-9.]+)`)
)

// checkExpr checks one PromQL expression and returns the outcomes and
// quantiles it queries.
func checkExpr(t *testing.T, where, expr string, names, labels map[string]bool) (used []string) {
	t.Helper()
	refs := metricRef.FindAllStringSubmatch(expr, -1)
	assert.NotEmpty(t, refs, "%s: no metric in %q", where, expr)
	for _, m := range refs {
		assert.True(t, names[m[1]], "%s: metric %q is not exported by idemprom (%v)", where, m[1], keys(names))
	}
	for _, m := range matcherRef.FindAllStringSubmatch(expr, -1) {
		assert.True(t, labels[m[1]], "%s: label %q is not exported by idemprom", where, m[1])
	}
	for _, m := range groupRef.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			assert.True(t, labels[strings.TrimSpace(l)], "%s: label %q is not exported by idemprom", where, strings.TrimSpace(l))
		}
	}
	for _, m := range outcomeRef.FindAllStringSubmatch(expr, -1) {
		for _, o := range strings.Split(m[1], "|") {
			assert.True(t, outcomes[o], "%s: outcome %q is not a idempotency.Outcome", where, o)
			used = append(used, o)
		}
	}
	for _, m := range quantile.FindAllStringSubmatch(expr, -1) {
		used = append(used, "quantile "+m[1])
	}
	return used
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// The Grafana dashboard parses, and every metric, label and outcome it
// queries exists; it shows what it promises.
func TestDashboardQueriesExportedSeries(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(raw, &d), "the dashboard is JSON")
	require.NotEmpty(t, d.Title)
	names, labels := exported(t)

	used := map[string]bool{}
	exprs := 0
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has queries", p.Title)
		for _, target := range p.Targets {
			require.Contains(t, target.Expr, "${prefix}", "panel %q: metric names take the namespace prefix", p.Title)
			for _, o := range checkExpr(t, "panel "+p.Title, strings.ReplaceAll(target.Expr, "${prefix}", ""), names, labels) {
				used[o] = true
			}
			exprs++
		}
	}
	assert.GreaterOrEqual(t, exprs, 6)
	for _, want := range []string{"duplicate", "in_progress", "complete_failed", "lease_lost", "quantile 0.5", "quantile 0.99"} {
		assert.True(t, used[want], "the dashboard shows %s", want)
	}
	for _, v := range d.Templating.List {
		q, _ := v.Query.(string)
		if m := regexp.MustCompile(`label_values\(\s*([^,\s]+)\s*,\s*(\w+)\s*\)`).FindStringSubmatch(q); m != nil {
			name := strings.ReplaceAll(m[1], "${prefix}", "")
			assert.True(t, names[name], "variable %s: metric %q", v.Name, name)
			assert.True(t, labels[m[2]], "variable %s: label %q", v.Name, m[2])
		}
	}
}

// The alert rules parse, and alert on complete_failed, lease_lost,
// output_not_stored and caller_gone with exported series only.
func TestAlertRulesQueryExportedSeries(t *testing.T) {
	raw, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	names, labels := exported(t)
	used := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert)
			for _, o := range checkExpr(t, "alert "+r.Alert, r.Expr, names, labels) {
				used[o] = true
			}
		}
	}
	assert.True(t, used["complete_failed"], "an alert on complete_failed")
	assert.True(t, used["lease_lost"], "an alert on lease_lost")
	assert.True(t, used["output_not_stored"], "an alert on output_not_stored: an output that may be lost")
	assert.True(t, used["caller_gone"], "an alert on caller_gone: a store down while callers' deadlines are below StoreTimeout shows only there")
}
