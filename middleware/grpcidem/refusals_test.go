package grpcidem_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// TestRefusalsTable: the adapters' one table of their own answers is keyed
// by outcome names (and three answers before a claim), with the HTTP status
// and gRPC code the package documentation and docs/GUARANTEES.md give.
func TestRefusalsTable(t *testing.T) {
	want := map[string]struct {
		http int
		grpc codes.Code
	}{
		string(idempotency.OutcomeMissingKey):       {400, codes.InvalidArgument},
		string(idempotency.OutcomeKeyReused):        {422, codes.FailedPrecondition},
		string(idempotency.OutcomeInProgress):       {409, codes.Aborted},
		string(idempotency.OutcomeTooManyAttempts):  {422, codes.FailedPrecondition},
		string(idempotency.OutcomeStoreUnavailable): {503, codes.Unavailable},
		string(idempotency.OutcomeCorruptRecord):    {500, codes.Internal},
		string(idempotency.OutcomeOutputNotStored):  {410, codes.AlreadyExists},
		adapter.BodyTooLarge:                        {413, codes.OK},
		adapter.BodyUnreadable:                      {400, codes.OK},
		adapter.NotProtoMessage:                     {0, codes.Internal},
	}
	assert.Len(t, adapter.Refusals, len(want))
	for name, w := range want {
		r, ok := adapter.Refusals[name]
		if assert.True(t, ok, name) {
			assert.Equal(t, w.http, r.HTTP, name)
			assert.Equal(t, w.grpc, codes.Code(r.GRPC), name)
			assert.NotEmpty(t, r.Title, name)
		}
	}
	assert.Equal(t, "TOO_MANY_ATTEMPTS", adapter.Reason(string(idempotency.OutcomeTooManyAttempts)))
}
