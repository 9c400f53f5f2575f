package httpidem

import (
	"encoding/binary"
	"errors"
	"net/http"
	"sort"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// A stored response, the Result of a COMPLETED key, is: a version byte, a
// flags byte, the status, the header count, per header its name and its
// values, then the body, or only its size when flagBodyOmitted. Numbers are
// uvarints; names are sorted, so one response has one encoding.

const (
	recordVersion   = 1
	flagBodyOmitted = 1 << 0
)

var errBadRecord = errors.New("httpidem: malformed stored response")

// storedResponse is what a repeat is answered with.
type storedResponse struct {
	Status      int
	Header      http.Header
	Body        []byte
	BodyOmitted bool // over MaxOutputSize: BodySize is its size
	BodySize    int64
}

func (s storedResponse) encode() []byte {
	names := make([]string, 0, len(s.Header))
	size := 2 + 3*binary.MaxVarintLen64 + len(s.Body)
	for name, values := range s.Header {
		names = append(names, name)
		size += 2*binary.MaxVarintLen64 + len(name)
		for _, v := range values {
			size += binary.MaxVarintLen64 + len(v)
		}
	}
	sort.Strings(names)

	b := make([]byte, 0, size)
	var flags byte
	if s.BodyOmitted {
		flags |= flagBodyOmitted
	}
	b = append(b, recordVersion, flags)
	b = binary.AppendUvarint(b, uint64(s.Status))
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = adapter.AppendField(b, name)
		values := s.Header[name]
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = adapter.AppendField(b, v)
		}
	}
	if s.BodyOmitted {
		return binary.AppendUvarint(b, uint64(s.BodySize))
	}
	return adapter.AppendField(b, s.Body)
}

func decodeResponse(b []byte) (storedResponse, error) {
	d := adapter.NewReader(b, errBadRecord)
	var s storedResponse
	version, flags := d.Byte(), d.Byte()
	if d.Err() == nil && (version != recordVersion || flags&^flagBodyOmitted != 0) {
		d.Fail("version %d, flags %#x", version, flags)
		return storedResponse{}, d.Err()
	}
	s.BodyOmitted = flags&flagBodyOmitted != 0
	status := d.Uvarint(999)
	if d.Err() == nil && status < 100 {
		d.Fail("status %d", status)
		return storedResponse{}, d.Err()
	}
	s.Status = int(status)
	n := d.Uvarint(uint64(d.Left()))
	s.Header = make(http.Header, n)
	for i := uint64(0); i < n && d.Err() == nil; i++ {
		name := string(d.Bytes())
		count := d.Uvarint(uint64(d.Left()))
		values := make([]string, 0, count)
		for j := uint64(0); j < count && d.Err() == nil; j++ {
			values = append(values, string(d.Bytes()))
		}
		if _, dup := s.Header[name]; dup {
			d.Fail("header %q twice", name)
		}
		s.Header[name] = values
	}
	if s.BodyOmitted {
		s.BodySize = int64(d.Uvarint(1 << 62))
	} else {
		s.Body = d.Bytes()
		s.BodySize = int64(len(s.Body))
	}
	if err := d.Finish(); err != nil {
		return storedResponse{}, err
	}
	return s, nil
}
