package grpcidem

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter/serve"
)

// What is wrong with a key beyond adapter.CheckKey's rules.
var (
	errKeyRepeated = errors.New("is sent more than once")
	errKeyConflict = errors.New("differs between the metadata and the request message")
)

// extractKey returns the call's key, from md under any of names or from
// req's string field named field, and "" when neither carries one. A
// wrong key's error names its source. Every source that carries a key must
// agree. An empty field is absent; an empty metadata value is invalid.
func extractKey(md metadata.MD, names []string, req proto.Message, field string) (key string, source string, err error) {
	from := ""
	for _, name := range names {
		values := md.Get(name)
		switch {
		case len(values) == 0:
			continue
		case len(values) > 1:
			return "", "metadata " + name, errKeyRepeated
		}
		if err := adapter.CheckKey(values[0]); err != nil {
			return "", "metadata " + name, err
		}
		if from != "" && values[0] != key {
			return "", "metadata " + name, fmt.Errorf("differs from the one in %s", from)
		}
		key, from = values[0], "metadata "+name
	}
	if v, ok := fieldKey(req, field); ok && v != "" {
		if err := adapter.CheckKey(v); err != nil {
			return "", "request field " + field, err
		}
		if from != "" && v != key {
			return "", "request field " + field, errKeyConflict
		}
		key = v
	}
	return key, "", nil
}

// fieldKey returns req's singular string field named field, if it has one.
func fieldKey(req proto.Message, field string) (string, bool) {
	if req == nil {
		return "", false
	}
	m := req.ProtoReflect()
	if !m.IsValid() {
		return "", false
	}
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(field))
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
		return "", false
	}
	return m.Get(fd).String(), true
}

// fingerprintVersion changes whenever the fingerprint's input changes.
const fingerprintVersion = 1

// fingerprint hashes the full method name and the request's deterministic
// wire bytes; unknown fields count as sent.
func fingerprint(method string, req proto.Message) ([]byte, error) {
	body, err := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.Marshal(req)
	if err != nil {
		return nil, err
	}
	return adapter.Fingerprint(fingerprintVersion, []byte(method), body), nil
}

// ForwardKey returns the key a handler hands on with its work, as the
// requestId of a message it publishes: the scope's hash, a colon and the
// key. The scope never appears. ok is false outside a handler the
// [Middleware] protects (also under FailOpen).
func ForwardKey(ctx context.Context) (key string, ok bool) { return serve.ForwardKey(ctx) }
