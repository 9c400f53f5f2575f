package adapter

import (
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Answers the adapters give before a key is claimed. They are no
// outcome: the Observer never sees them.
const (
	BodyTooLarge    idempotency.Outcome = "body_too_large"    // HTTP only
	BodyUnreadable  idempotency.Outcome = "body_unreadable"   // HTTP only
	NotProtoMessage idempotency.Outcome = "not_proto_message" // gRPC only
)

// Refusal is an answer an adapter gives itself instead of the handler's.
type Refusal struct {
	HTTP  int        // the status of the HTTP problem
	GRPC  codes.Code // the code of the gRPC status
	Title string     // the HTTP problem's title
	Retry bool       // the same key may succeed later: Retry-After, RetryInfo
}

// Refusals is the one table of the adapters' own answers, keyed by the
// outcome they report. An HTTP problem's type is a base and the key; a
// gRPC ErrorInfo's reason is the key in upper case ([Reason]).
var Refusals = map[idempotency.Outcome]Refusal{
	idempotency.OutcomeMissingKey:       {http.StatusBadRequest, codes.InvalidArgument, "Idempotency key is missing or invalid", false},
	idempotency.OutcomeKeyReused:        {http.StatusUnprocessableEntity, codes.FailedPrecondition, "Idempotency key reused for a different request", false},
	idempotency.OutcomeInProgress:       {http.StatusConflict, codes.Aborted, "A request with this idempotency key is in progress", true},
	idempotency.OutcomeStoreUnavailable: {http.StatusServiceUnavailable, codes.Unavailable, "Idempotency store unavailable", true},
	idempotency.OutcomeCorruptRecord:    {http.StatusInternalServerError, codes.Internal, "Idempotency record could not be read", false},
	idempotency.OutcomeOutputNotStored:  {http.StatusGone, codes.AlreadyExists, "Response was too large to store", false},
	BodyTooLarge:                        {http.StatusRequestEntityTooLarge, codes.InvalidArgument, "Request body is too large", false},
	BodyUnreadable:                      {http.StatusBadRequest, codes.InvalidArgument, "Request body could not be read", false},
	NotProtoMessage:                     {http.StatusInternalServerError, codes.Internal, "Request is not a protocol buffers message", false},
}

// Reason is the gRPC ErrorInfo reason of outcome: its name in upper case,
// as "IN_PROGRESS" for in_progress.
func Reason(outcome idempotency.Outcome) string { return strings.ToUpper(string(outcome)) }
