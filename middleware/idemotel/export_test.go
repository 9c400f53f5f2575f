package idemotel

// The names the package documentation gives, for the tests.
const (
	ScopeName           = scopeName
	AttrKeyHash         = attrKeyHash
	AttrScope           = attrScope
	AttrOutcome         = attrOutcome
	AttrAttempt         = attrAttempt
	AttrReplayed        = attrReplayed
	OutcomesMetric      = outcomesMetric
	StoreDurationMetric = storeDurationMetric
	CacheLookupsMetric  = cacheLookupsMetric
)
