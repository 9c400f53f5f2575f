package configerr_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

var (
	errInvalid = errors.New("pkg: invalid config")
	errNoStore = errors.New("pkg: nil store")
)

func TestList(t *testing.T) {
	l := configerr.New(errInvalid)
	require.NoError(t, l.Err(), "no problem, no error")

	l.Add(errNoStore)
	l.Addf("Lease is %v, must not be negative", -1)
	l.Addf("Header %q: %w", "X Y", errors.ErrUnsupported)
	err := l.Err()
	require.Error(t, err)
	assert.Equal(t, "pkg: nil store\npkg: invalid config: Lease is -1, must not be negative\npkg: invalid config: Header \"X Y\": unsupported operation",
		err.Error(), "every problem, in the order added")
	assert.ErrorIs(t, err, errInvalid)
	assert.ErrorIs(t, err, errNoStore)
	assert.ErrorIs(t, err, errors.ErrUnsupported)

	joined, ok := err.(interface{ Unwrap() []error })
	require.True(t, ok, "errors.Join")
	problems := joined.Unwrap()
	require.Len(t, problems, 3)
	for _, p := range problems {
		assert.ErrorIs(t, p, errInvalid, "each problem on its own: %v", p)
	}
	assert.ErrorIs(t, problems[0], errNoStore)
	assert.NotErrorIs(t, problems[1], errNoStore)
}

func TestRules(t *testing.T) {
	l := configerr.New(errInvalid)
	configerr.NotNegative(l, "Zero", 0)
	configerr.NotNegative(l, "Size", -2)
	configerr.NotNegative(l, "Timeout", -time.Second)
	configerr.Renewable(l, 0)
	configerr.Renewable(l, configerr.MinLease)
	configerr.Renewable(l, configerr.MinLease-1)
	assert.Equal(t, "pkg: invalid config: Size is -2, must not be negative\n"+
		"pkg: invalid config: Timeout is -1s, must not be negative\n"+
		"pkg: invalid config: LeaseTTL 2.999999ms is too short to renew every LeaseTTL/3",
		l.Err().Error(), "zero (the default) and MinLease pass; below zero and below MinLease do not")
}

func TestTTLAndKeyPrefix(t *testing.T) {
	l := configerr.New(errInvalid)
	configerr.TTL(l, "Zero", 0)
	configerr.TTL(l, "Max", configerr.MaxTTL)
	configerr.TTL(l, "Negative", -time.Second)
	configerr.TTL(l, "Over", configerr.MaxTTL+time.Nanosecond)
	configerr.TTL(l, "Forever", time.Duration(math.MaxInt64))
	configerr.KeyPrefix(l, "")
	configerr.KeyPrefix(l, "shop.billing")
	configerr.KeyPrefix(l, "{idem}/%20 \x00")
	configerr.KeyPrefix(l, "shop:billing")
	configerr.KeyPrefix(l, ":")
	assert.Equal(t, "pkg: invalid config: Negative is -1s, must not be negative\n"+
		"pkg: invalid config: Over is 876000h0m0.000000001s, must be at most 876000h0m0s (100 years; there is no \"no expiry\")\n"+
		"pkg: invalid config: Forever is 2562047h47m16.854775807s, must be at most 876000h0m0s (100 years; there is no \"no expiry\")\n"+
		"pkg: invalid config: KeyPrefix \"shop:billing\" holds \":\", the separator of prefix:scope:key; use another character (\"shop.billing\", say)\n"+
		"pkg: invalid config: KeyPrefix \":\" holds \":\", the separator of prefix:scope:key; use another character (\".\", say)",
		l.Err().Error(), "zero and MaxTTL pass, and so does a prefix of any bytes but a colon")
}
