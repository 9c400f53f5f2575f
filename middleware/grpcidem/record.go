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

// A stored answer is a small binary record, the Result of a COMPLETED key:
//
//	version  1 byte, recordVersion
//	kind     1 byte:
//	  kindMessage   the response: uvarint length + message full name,
//	                uvarint length + wire bytes
//	  kindStatus    a final status: uvarint length + google.rpc.Status
//	                (code, message, details) in wire format
//	  kindOmitted   an answer over MaxOutputSize: uvarint code (0 for a
//	                response), uvarint size of what was not stored
//
// Decoding is strict: any truncation, overlong length, unknown kind or
// trailing byte is an error, never a partial answer.

const (
	recordVersion = 1

	kindMessage = 1
	kindStatus  = 2
	kindOmitted = 3
)

var errBadRecord = errors.New("grpcidem: malformed stored answer")

// storedAnswer is what a repeat is answered with: a response message, a
// final status, or neither when the answer was too large to store.
type storedAnswer struct {
	Kind byte
	// TypeName and Wire are the response's, for kindMessage.
	TypeName string
	Wire     []byte
	// Status is the final status, for kindStatus, and statusWire its wire
	// bytes.
	Status     *spb.Status
	statusWire []byte
	// Code and Size describe an answer that was not stored, for
	// kindOmitted.
	Code codes.Code
	Size int
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

// decodeAnswer reads a stored answer. The status of a kindStatus record is
// decoded as well; a response's message is rebuilt by message.
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

// message rebuilds a stored response from the protobuf type registry. want
// is the method's output type when the registry knows the method, else "":
// a stored response of another type (the method changed its output type
// since it was stored) is an error, never a wrong message on the wire.
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
