package configerr_test

import (
	"errors"
	"testing"

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
