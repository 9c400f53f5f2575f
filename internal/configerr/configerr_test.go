package configerr_test

import (
	"errors"
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
