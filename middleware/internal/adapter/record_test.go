package adapter_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

var errMalformed = errors.New("malformed record")

func TestReader(t *testing.T) {
	rec := adapter.AppendField([]byte{7}, "name")
	rec = adapter.AppendField(rec, []byte{1, 2})

	r := adapter.NewReader(rec, errMalformed)
	assert.EqualValues(t, 7, r.Byte())
	assert.Equal(t, "name", string(r.Bytes()))
	assert.Equal(t, []byte{1, 2}, r.Bytes())
	assert.Zero(t, r.Left())
	require.NoError(t, r.Finish())

	// Every truncation and a trailing byte are errors, never a partial read.
	for i := range len(rec) {
		r := adapter.NewReader(rec[:i], errMalformed)
		r.Byte()
		r.Bytes()
		r.Bytes()
		assert.ErrorIs(t, r.Finish(), errMalformed, "truncated to %d bytes", i)
	}
	r = adapter.NewReader(append(rec, 0), errMalformed)
	r.Byte()
	r.Bytes()
	r.Bytes()
	assert.ErrorIs(t, r.Finish(), errMalformed, "trailing byte")

	// A number over its bound fails, and so does every read after it.
	r = adapter.NewReader(rec, errMalformed)
	assert.Zero(t, r.Uvarint(6))
	assert.Nil(t, r.Bytes())
	assert.EqualError(t, r.Finish(), "malformed record: bad number")
}
