package httpidem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sort"
)

// A stored response is a small binary record, the Result of a COMPLETED key:
//
//	version  1 byte, recordVersion
//	flags    1 byte, flagBodyOmitted when the body exceeded MaxResponseBody
//	status   uvarint
//	headers  uvarint count, then per header name: uvarint length + name,
//	         uvarint value count, per value: uvarint length + value
//	body     uvarint length, then the body unless omitted (then the length
//	         is the size of the response that was not stored)
//
// Header names are sorted, so one response always encodes to the same bytes.
// Decoding is strict: any truncation, overlong length or trailing byte is an
// error, never a partial response.

const (
	recordVersion   = 1
	flagBodyOmitted = 1 << 0
)

var errBadRecord = errors.New("httpidem: malformed stored response")

// storedResponse is what a repeat is answered with.
type storedResponse struct {
	Status int
	Header http.Header
	Body   []byte
	// BodyOmitted is set when the body exceeded MaxResponseBody and was not
	// stored; BodySize is then its size.
	BodyOmitted bool
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
		b = appendString(b, name)
		values := s.Header[name]
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = appendString(b, v)
		}
	}
	if s.BodyOmitted {
		return binary.AppendUvarint(b, uint64(s.BodySize))
	}
	b = binary.AppendUvarint(b, uint64(len(s.Body)))
	return append(b, s.Body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func decodeResponse(b []byte) (storedResponse, error) {
	d := decoder{b: b}
	var s storedResponse
	version, flags := d.byte(), d.byte()
	if d.err == nil && (version != recordVersion || flags&^flagBodyOmitted != 0) {
		return s, fmt.Errorf("%w: version %d, flags %#x", errBadRecord, version, flags)
	}
	s.BodyOmitted = flags&flagBodyOmitted != 0
	status := d.uvarint(999)
	if d.err == nil && status < 100 {
		return s, fmt.Errorf("%w: status %d", errBadRecord, status)
	}
	s.Status = int(status)
	n := d.uvarint(uint64(len(d.b)))
	s.Header = make(http.Header, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		name := d.string()
		count := d.uvarint(uint64(len(d.b)))
		values := make([]string, 0, count)
		for j := uint64(0); j < count && d.err == nil; j++ {
			values = append(values, d.string())
		}
		if _, dup := s.Header[name]; dup && d.err == nil {
			d.err = fmt.Errorf("%w: header %q twice", errBadRecord, name)
		}
		s.Header[name] = values
	}
	if s.BodyOmitted {
		s.BodySize = int64(d.uvarint(1 << 62))
	} else {
		s.Body = d.bytes()
		s.BodySize = int64(len(s.Body))
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", errBadRecord, len(d.b))
	}
	if d.err != nil {
		return storedResponse{}, d.err
	}
	return s, nil
}

// decoder reads a record; after the first error every read returns zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s", errBadRecord, what)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.fail("byte")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint(max uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > max {
		d.fail("length")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint(1 << 62)
	if d.err == nil && n > uint64(len(d.b)) {
		d.fail("length")
	}
	if d.err != nil {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.bytes()) }
