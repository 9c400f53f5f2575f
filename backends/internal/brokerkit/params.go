package brokerkit

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/commalist"
)

// Params are the backend's own parameters of a broker URL's query, as
// pgxpool reads pool_max_conns from a connection string.
type Params struct {
	values map[string]string
	errs   []string
}

// TakeParams removes the parameters named in names from raw's query, and
// returns raw without them, for the client library, and their values.
// A parameter given twice, or whose value does not unescape, is an error.
func TakeParams(raw string, names ...string) (string, *Params, error) {
	if err := CheckAuthority(raw); err != nil {
		return "", nil, err
	}
	p := &Params{values: map[string]string{}}
	// CheckAuthority refused an '@' after a '?' or '#': the first of each
	// starts the query or the fragment.
	base, fragment, hasFragment := strings.Cut(raw, "#")
	base, query, _ := strings.Cut(base, "?")
	var kept []string
	for kv := range strings.SplitSeq(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if name, err := url.QueryUnescape(k); err == nil {
			k = name // max%5Fidle%5Ftime is max_idle_time, as the libraries read it
		}
		switch {
		case kv == "":
		case !slices.Contains(names, k):
			kept = append(kept, kv)
		default:
			if _, dup := p.values[k]; dup {
				return "", nil, fmt.Errorf("the parameter %s twice", k)
			}
			u, err := url.QueryUnescape(v)
			if err != nil {
				return "", nil, fmt.Errorf("the parameter %s does not unescape", k)
			}
			p.values[k] = strings.TrimSpace(u)
		}
	}
	if len(kept) > 0 {
		base += "?" + strings.Join(kept, "&")
	}
	if hasFragment {
		base += "#" + fragment
	}
	return base, p, nil
}

// Duration returns the parameter name, def when it is absent, empty or
// zero.
func (p *Params) Duration(name string, def time.Duration) time.Duration {
	v := p.values[name]
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		p.errs = append(p.errs, fmt.Sprintf("%s=%q is not a duration such as 500ms or 2s", name, v))
	case d < 0:
		p.errs = append(p.errs, fmt.Sprintf("%s=%q is negative", name, v))
	case d > 0:
		return d
	}
	return def
}

// Int returns the parameter name as an integer of bits bits, def when it is
// absent, empty or zero.
func (p *Params) Int(name string, def int64, bits int) int64 {
	v := p.values[name]
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, bits)
	switch {
	case err != nil:
		p.errs = append(p.errs, fmt.Sprintf("%s=%q is not a %d-bit integer", name, v, bits))
	case n < 0:
		p.errs = append(p.errs, fmt.Sprintf("%s=%q is negative", name, v))
	case n > 0:
		return n
	}
	return def
}

// String returns the parameter name, def when it is absent or empty.
func (p *Params) String(name, def string) string {
	if v := p.values[name]; v != "" {
		return v
	}
	return def
}

// List returns the comma-separated parameter name, without empty items.
func (p *Params) List(name string) []string { return commalist.Split(p.values[name]) }

// Fail records a problem with a parameter.
func (p *Params) Fail(format string, args ...any) {
	p.errs = append(p.errs, fmt.Sprintf(format, args...))
}

// Err returns every problem found, or nil.
func (p *Params) Err() error {
	if len(p.errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(p.errs, "; "))
}
