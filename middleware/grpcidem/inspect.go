package grpcidem

import (
	"google.golang.org/grpc/codes"

	"github.com/idempotency/watermill-idempotency/internal/adapterinspect"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// idemctl reads the keys and stored answers with the code that writes them.
func init() {
	adapterinspect.Register(adapterinspect.Adapter{Name: "grpc", DefaultPrefix: defaultKeyPrefix,
		ClientKey: func(sent string) (string, error) { return sent, adapter.CheckKey(sent) },
		StoreKey:  storeKey, Describe: describeAnswer})
}

func describeAnswer(result []byte) (adapterinspect.Answer, error) {
	a, err := decodeAnswer(result)
	if err != nil {
		return adapterinspect.Answer{}, err
	}
	switch a.Kind {
	case kindMessage:
		n := len(a.Wire)
		return adapterinspect.Answer{Format: "grpc_response", Type: a.TypeName, Bytes: &n}, nil
	case kindStatus:
		return adapterinspect.Answer{Format: "grpc_status", Code: codes.Code(a.Status.Code).String(), Message: a.Status.Message}, nil
	default: // kindOmitted: decodeAnswer accepts no other kind
		n := a.Size
		return adapterinspect.Answer{Format: "grpc_not_stored", Code: a.Code.String(), Bytes: &n}, nil
	}
}

func storeKey(prefix, scope, key string) string { return adapter.StoreKey(prefix, scope, key, true) }
