package grpcidem

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// What is wrong with a key beyond adapter.CheckKey's rules.
var (
	errKeyRepeated = errors.New("is sent more than once")
	errKeyConflict = errors.New("differs between the metadata and the request message")
)

// extractKey returns the call's idempotency key, from md under any of names
// or from the string field named field of req. It returns "" and nil when
// neither carries one; a wrong key's error names its source ("metadata
// idempotency-key", "request field request_id").
//
// A metadata key may appear once, with one value; several configured names
// must agree, and so must the metadata and the request field when both
// carry a key. The key must be printable ASCII (0x20 to 0x7E), not empty,
// as in package httpidem; a long one is hashed (adapter.StoreKey). An empty field is absent (proto3 has no
// other way to leave it out); an empty metadata value is an invalid key.
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

// fieldKey returns the value of req's singular string field named field,
// and whether req has such a field.
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

// fingerprintVersion changes whenever the fingerprint's input changes, so
// that records of an older version never match by accident.
const fingerprintVersion = 1

// fingerprint identifies the call a key was first used for: SHA-256 over
// the full method name and the request's deterministic wire encoding
// (proto.MarshalOptions{Deterministic: true}: map entries sorted), each
// length-prefixed. Two calls of one method whose messages are equal have
// the same fingerprint in one binary; unknown fields count as sent.
func fingerprint(method string, req proto.Message) ([]byte, error) {
	body, err := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.Marshal(req)
	if err != nil {
		return nil, err
	}
	return adapter.Fingerprint(fingerprintVersion, []byte(method), body), nil
}

// forwardKeyCtx is the context key of the call's forward key.
type forwardKeyCtx struct{}

// ForwardKey returns the key a handler hands on with its work, as the
// requestId of a message it publishes, say: the scope's hash, a colon and
// the call's key, as httpidem.ForwardKey has it. Two tenants' same key
// forward two values; the scope itself never appears. It is in the
// handler's context, also under FailOpen. ok is false elsewhere: for a
// method not in Methods, or a call without a key under KeyOptional.
func ForwardKey(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(forwardKeyCtx{}).(string)
	return key, ok
}

// withForwardKey returns ctx carrying the forward key of the stored key
// skey.
func withForwardKey(ctx context.Context, prefix, skey string) context.Context {
	return context.WithValue(ctx, forwardKeyCtx{}, adapter.ForwardKey(prefix, skey))
}
