package grpcidem

import (
	"encoding/binary"
	"errors"
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// A stored answer, the Result of a COMPLETED key, is a version byte, a kind
// byte, then: the response's full name and wire bytes (kindMessage); the
// google.rpc.Status's wire bytes (kindStatus); or, over MaxOutputSize, the
// code and the size not stored (kindOmitted). Numbers are uvarints.

const (
	recordVersion = 1

	kindMessage = 1
	kindStatus  = 2
	kindOmitted = 3
)

var errBadRecord = errors.New("grpcidem: malformed stored answer")

// storedAnswer is what a repeat is answered with.
type storedAnswer struct {
	Kind       byte
	TypeName   string // kindMessage
	Wire       []byte
	Status     *spb.Status // kindStatus
	statusWire []byte
	Code       codes.Code // kindOmitted
	Size       int
}

// encodeResponse stores resp, or only its size when it exceeds max.
func encodeResponse(resp proto.Message, max int) ([]byte, storedAnswer, error) {
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if err != nil {
		return nil, storedAnswer{}, err
	}
	name := string(resp.ProtoReflect().Descriptor().FullName())
	if len(wire)+len(name) > max {
		a := storedAnswer{Kind: kindOmitted, Code: codes.OK, Size: len(wire) + len(name)}
		return a.encode(), a, nil
	}
	a := storedAnswer{Kind: kindMessage, TypeName: name, Wire: wire}
	return a.encode(), a, nil
}

// encodeStatus stores s, or only its code and size when it exceeds max.
func encodeStatus(s *status.Status, max int) ([]byte, storedAnswer, error) {
	p := s.Proto()
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		return nil, storedAnswer{}, err
	}
	if len(wire) > max {
		a := storedAnswer{Kind: kindOmitted, Code: s.Code(), Size: len(wire)}
		return a.encode(), a, nil
	}
	a := storedAnswer{Kind: kindStatus, Status: p, statusWire: wire}
	return a.encode(), a, nil
}

func (a storedAnswer) encode() []byte {
	b := []byte{recordVersion, a.Kind}
	switch a.Kind {
	case kindMessage:
		b = adapter.AppendField(b, a.TypeName)
		b = adapter.AppendField(b, a.Wire)
	case kindStatus:
		b = adapter.AppendField(b, a.statusWire)
	case kindOmitted:
		b = binary.AppendUvarint(b, uint64(a.Code))
		b = binary.AppendUvarint(b, uint64(a.Size))
	}
	return b
}

// decodeAnswer reads a stored answer; message rebuilds a response.
func decodeAnswer(b []byte) (storedAnswer, error) {
	d := adapter.NewReader(b, errBadRecord)
	var a storedAnswer
	version, kind := d.Byte(), d.Byte()
	if d.Err() == nil && version != recordVersion {
		d.Fail("version %d", version)
		return storedAnswer{}, d.Err()
	}
	a.Kind = kind
	switch kind {
	case kindMessage:
		a.TypeName = string(d.Bytes())
		a.Wire = d.Bytes()
		if d.Err() == nil && !protoreflect.FullName(a.TypeName).IsValid() {
			d.Fail("type name %q", a.TypeName)
		}
	case kindStatus:
		wire := d.Bytes()
		a.statusWire = wire
		if d.Err() == nil {
			a.Status = &spb.Status{}
			if err := proto.Unmarshal(wire, a.Status); err != nil {
				d.Fail("status: %w", err)
			} else if a.Status.Code <= 0 || a.Status.Code > int32(codes.Unauthenticated) {
				d.Fail("status code %d", a.Status.Code)
			}
		}
	case kindOmitted:
		a.Code = codes.Code(d.Uvarint(uint64(codes.Unauthenticated)))
		a.Size = int(d.Uvarint(1 << 40))
	default:
		d.Fail("kind %d", kind)
	}
	if err := d.Finish(); err != nil {
		return storedAnswer{}, err
	}
	return a, nil
}

// message rebuilds a stored response from the protobuf type registry. A
// response of another type than want, the method's, is an error.
func (a storedAnswer) message(want protoreflect.FullName) (proto.Message, error) {
	name := protoreflect.FullName(a.TypeName)
	if want != "" && want != name {
		return nil, fmt.Errorf("%w: stored response is a %s, the method returns %s", errBadRecord, name, want)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
	if err != nil {
		return nil, fmt.Errorf("%w: response type %s: %w", errBadRecord, name, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(a.Wire, m); err != nil {
		return nil, fmt.Errorf("%w: response of type %s: %w", errBadRecord, name, err)
	}
	return m, nil
}
