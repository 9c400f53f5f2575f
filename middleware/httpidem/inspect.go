package httpidem

import (
	"github.com/idempotency/watermill-idempotency/internal/adapterinspect"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// idemctl reads the keys and stored responses with the code that writes them.
func init() {
	adapterinspect.Register(adapterinspect.Adapter{Name: "http", DefaultPrefix: defaultKeyPrefix,
		ClientKey: func(sent string) (string, error) { return parseKey(sent) },
		StoreKey:  storeKey, Describe: describeResponse})
}

func describeResponse(result []byte) (adapterinspect.Answer, error) {
	s, err := decodeResponse(result)
	if err != nil {
		return adapterinspect.Answer{}, err
	}
	stored := !s.BodyOmitted
	return adapterinspect.Answer{Format: "http_response", Status: s.Status, Headers: s.Header,
		BodyBytes: &s.BodySize, BodyStored: &stored}, nil
}

func storeKey(prefix, scope, key string) string { return adapter.StoreKey(prefix, scope, key, true) }
