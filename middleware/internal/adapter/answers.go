package adapter

import "strings"

// Refusal is an answer the HTTP or gRPC adapter gives itself instead of
// the handler's.
type Refusal struct {
	HTTP  int    // the status of the HTTP problem; 0: gRPC only
	GRPC  uint32 // the google.golang.org/grpc/codes.Code; 0: HTTP only
	Title string // the HTTP problem's title
	Retry bool   // the same key may succeed later: Retry-After, RetryInfo
}

// Refusals is the one table of the adapters' own answers, keyed by outcome
// name. The last three are no outcome: they come before a claim, uncounted.
var Refusals = map[string]Refusal{
	"missing_key":       {400, 3, "Idempotency key is missing or invalid", false},              // INVALID_ARGUMENT
	"key_reused":        {422, 9, "Idempotency key reused for a different request", false},     // FAILED_PRECONDITION
	"in_progress":       {409, 10, "A request with this idempotency key is in progress", true}, // ABORTED
	"too_many_attempts": {422, 9, "Idempotency key failed too many times", false},              // FAILED_PRECONDITION
	"store_unavailable": {503, 14, "Idempotency store unavailable", true},                      // UNAVAILABLE
	"corrupt_record":    {500, 13, "Idempotency record could not be read", false},              // INTERNAL
	"output_not_stored": {410, 6, "Response was too large to store", false},                    // ALREADY_EXISTS
	BodyTooLarge:        {413, 0, "Request body is too large", false},
	BodyUnreadable:      {400, 0, "Request body could not be read", false},
	NotProtoMessage:     {0, 13, "Request is not a protocol buffers message", false}, // INTERNAL
}

// The refusals that are no outcome.
const (
	BodyTooLarge    = "body_too_large"
	BodyUnreadable  = "body_unreadable"
	NotProtoMessage = "not_proto_message"
)

// Reason is the gRPC ErrorInfo reason of the refusal name: its upper case.
func Reason(name string) string { return strings.ToUpper(name) }
