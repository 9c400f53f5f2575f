package storekit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/ThreeDotsLabs/watermill/message"
)

// A stored output starts with one of these bytes: outputMessages before a
// list of messages; OutputOmitted alone for an output not stored (too large,
// or replay disabled).
const (
	outputMessages byte = 1
	OutputOmitted  byte = 2
)

var errCorruptOutput = errors.New("idempotency: corrupt stored output")

// EncodeOutput encodes produced messages: UUID, metadata (sorted, so the
// encoding is deterministic) and payload of each, length-prefixed.
func EncodeOutput(msgs []*message.Message) []byte {
	size := 1 + binary.MaxVarintLen64
	for _, m := range msgs {
		size += 3*binary.MaxVarintLen64 + len(m.UUID) + len(m.Payload)
		for k, v := range m.Metadata {
			size += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, outputMessages)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	keys := make([]string, 0, 8)
	for _, m := range msgs {
		b = appendBytes(b, m.UUID)
		keys = keys[:0]
		for k := range m.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b = binary.AppendUvarint(b, uint64(len(keys)))
		for _, k := range keys {
			b = appendBytes(b, k)
			b = appendBytes(b, m.Metadata[k])
		}
		b = appendBytes(b, string(m.Payload))
	}
	return b
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// DecodeOutput reverses EncodeOutput: stored is false for an output not
// stored, and an empty result is no output. An error means b is not an
// output the middleware wrote. The messages own their bytes: b may be a
// cached record's result, which must not change.
func DecodeOutput(b []byte) (msgs []*message.Message, stored bool, err error) {
	if len(b) == 0 {
		return nil, true, nil
	}
	switch b[0] {
	case OutputOmitted:
		return nil, false, nil
	case outputMessages:
	default:
		return nil, false, fmt.Errorf("%w: format %d", errCorruptOutput, b[0])
	}
	r := reader{b: b[1:]}
	n := r.uvarint()
	if n > uint64(len(b)) {
		return nil, false, fmt.Errorf("%w: %d messages in %d bytes", errCorruptOutput, n, len(b))
	}
	msgs = make([]*message.Message, 0, n)
	for range n {
		uuid := r.str()
		nmeta := r.uvarint()
		if nmeta > uint64(len(b)) {
			return nil, false, errCorruptOutput
		}
		meta := make(message.Metadata, nmeta)
		for range nmeta {
			k := r.str()
			meta[k] = r.str()
		}
		payload := r.bytes()
		if r.err != nil {
			return nil, false, r.err
		}
		m := message.NewMessage(uuid, payload)
		m.Metadata = meta
		msgs = append(msgs, m)
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d trailing bytes", errCorruptOutput, len(r.b))
	}
	return msgs, true, r.err
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errCorruptOutput
		return 0
	}
	r.b = r.b[n:]
	return v
}

// str returns the next length-prefixed field as a string (a copy).
func (r *reader) str() string { return string(r.next()) }

// bytes returns the next length-prefixed field as a copy of its own.
func (r *reader) bytes() []byte {
	b := r.next()
	if r.err != nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// next returns the next length-prefixed field, aliasing r.b.
func (r *reader) next() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errCorruptOutput
		return nil
	}
	f := r.b[:n:n]
	r.b = r.b[n:]
	return f
}
